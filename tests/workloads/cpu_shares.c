/* Three named threads using ~100%, ~50% and ~10% of a CPU: in every 20 ms
 * period each spins for its share of the period, then sleeps until the next.
 * Then each idles (alive, so /proc still shows its CPU time) for IDLE_SECONDS.
 * Usage: cpu_shares SECONDS [IDLE_SECONDS] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include "common.h"

#define PERIOD_NS 20000000LL

struct share {
    const char *name;
    int percent;
};

static double duration, idle;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

__attribute__((noinline)) void burn_share(int percent) {
    long long end = now_ns() + (long long)(duration * 1e9);
    uint64_t x = 1;
    for (long long period = now_ns(); period < end; period += PERIOD_NS) {
        long long busy_until = period + PERIOD_NS * percent / 100;
        while (now_ns() < busy_until) WORK(2000, x);
        if (percent < 100) {
            struct timespec next = {(period + PERIOD_NS) / 1000000000LL, (period + PERIOD_NS) % 1000000000LL};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        }
    }
    sink = x;
}

static void *run(void *arg) {
    struct share *share = arg;
    pthread_setname_np(pthread_self(), share->name);
    burn_share(share->percent);
    struct timespec rest = {(time_t)idle, (long)((idle - (time_t)idle) * 1e9)};
    nanosleep(&rest, NULL);
    return NULL;
}

int main(int argc, char **argv) {
    duration = seconds_arg(argc, argv, 5);
    idle = argc > 2 ? atof(argv[2]) : 0;
    static struct share shares[] = {{"busy-100", 100}, {"busy-50", 50}, {"busy-10", 10}};
    pthread_t threads[3];
    for (int i = 0; i < 3; i++) pthread_create(&threads[i], NULL, run, &shares[i]);
    for (int i = 0; i < 3; i++) pthread_join(threads[i], NULL);
    return 0;
}
