// Processes of threads that wake on a rhythm and burn a little CPU each
// time: what the CPU ledger reads at every drain (bench/thread_cpu_cost.sh).
// Usage: rhythm_threads PROCESSES THREADS PERIOD_US BURN_US SECONDS
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long period_ns, burn_ns;

static long long thread_cpu_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
}

static void *rhythm(void *unused) {
    (void)unused;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    for (;;) {
        long long start = thread_cpu_ns();
        while (thread_cpu_ns() - start < burn_ns) {
        }
        deadline.tv_nsec += period_ns;
        while (deadline.tv_nsec >= 1000000000) {
            deadline.tv_nsec -= 1000000000;
            deadline.tv_sec++;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s PROCESSES THREADS PERIOD_US BURN_US SECONDS\n", argv[0]);
        return 2;
    }
    int processes = atoi(argv[1]), threads = atoi(argv[2]), seconds = atoi(argv[5]);
    period_ns = atol(argv[3]) * 1000;
    burn_ns = atol(argv[4]) * 1000;
    for (int p = 0; p < processes; p++) {
        if (fork() == 0) {
            for (int t = 0; t < threads; t++) {
                pthread_t thread;
                pthread_create(&thread, NULL, rhythm, NULL);
            }
            sleep(seconds);
            _exit(0);
        }
    }
    while (wait(NULL) > 0) {
    }
    return 0;
}
