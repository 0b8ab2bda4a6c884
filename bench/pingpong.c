/* A context-switch storm: two threads bounce one byte over a pair of pipes.
 * Every round trip is two blocking reads, so two sleeps and two wake-ups.
 * Usage: pingpong ROUND_TRIPS   (prints round trips per second)
 *        pingpong -t SECONDS    (runs for SECONDS; every 100 ms prints
 *                                "CLOCK_MONOTONIC_NS ROUND_TRIPS_SO_FAR", so a
 *                                caller can take the rate over any window) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Echoes every byte back until it receives 'q'. */
static void *echo(void *unused) {
    char byte;
    (void)unused;
    for (;;) {
        if (read(ping[0], &byte, 1) != 1) exit(1);
        if (byte == 'q') return NULL;
        if (write(pong[1], &byte, 1) != 1) exit(1);
    }
}

static void round_trip(void) {
    char byte = 'x';
    if (write(ping[1], &byte, 1) != 1 || read(pong[0], &byte, 1) != 1) exit(1);
}

static void stop_echo(pthread_t thread) {
    char quit = 'q';
    if (write(ping[1], &quit, 1) != 1) exit(1);
    pthread_join(thread, NULL);
}

int main(int argc, char **argv) {
    int timed = argc > 2 && strcmp(argv[1], "-t") == 0;
    if (pipe(ping) || pipe(pong)) return 1;
    pthread_t thread;
    pthread_create(&thread, NULL, echo, NULL);
    if (timed) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        long long start = now_ns(), end = start + (long long)(atof(argv[2]) * 1e9);
        long long next_report = start, now = start;
        long rounds = 0;
        while (now < end) {
            if (now >= next_report) {
                printf("%lld %ld\n", now, rounds);
                next_report += 100000000LL;
            }
            for (int i = 0; i < 256; i++) round_trip();
            rounds += 256;
            now = now_ns();
        }
        printf("%lld %ld\n", now, rounds);
        stop_echo(thread);
        return 0;
    }
    long rounds = argc > 1 ? atol(argv[1]) : 200000;
    long long start = now_ns();
    for (long i = 0; i < rounds; i++) round_trip();
    long long end = now_ns();
    stop_echo(thread);
    printf("%.0f\n", rounds / ((end - start) / 1e9));
    return 0;
}
