/* A context-switch storm: two threads bounce one byte over a pair of pipes.
 * Every round trip is two blocking reads, so two sleeps and two wake-ups.
 * Usage: pingpong ROUND_TRIPS   (prints round trips per second) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];
static long rounds;

static void *echo(void *unused) {
    char byte;
    (void)unused;
    for (long i = 0; i < rounds; i++) {
        if (read(ping[0], &byte, 1) != 1 || write(pong[1], &byte, 1) != 1) exit(1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 200000;
    if (pipe(ping) || pipe(pong)) return 1;
    pthread_t thread;
    pthread_create(&thread, NULL, echo, NULL);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    char byte = 'x';
    for (long i = 0; i < rounds; i++) {
        if (write(ping[1], &byte, 1) != 1 || read(pong[0], &byte, 1) != 1) return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    pthread_join(thread, NULL);
    double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    printf("%.0f\n", rounds / seconds);
    return 0;
}
