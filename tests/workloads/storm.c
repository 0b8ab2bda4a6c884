/* One user's off-CPU storm (issue 30): THREADS threads each wait ~1 ms at
 * a time, at a depth of recursion (0 to 99) that changes with every wait, so every
 * drain brings the store THREADS x DEPTHS new (thread, stack) entries.
 * Usage: storm THREADS SECONDS */
#define _GNU_SOURCE
#include <pthread.h>
#include "attack.h"

#define DEPTHS 100
#define MAX_THREADS 1024

static double end_time;

/* noinline, and work after the call: each level stays a frame of its own. */
__attribute__((noinline)) unsigned storm_level(unsigned depth) {
    if (depth == 0) {
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL);
        return 1;
    }
    unsigned below = storm_level(depth - 1);
    sink = below;
    return below + 1;
}

static void *storm_thread(void *arg) {
    unsigned depth = (unsigned)(uintptr_t)arg;
    while (now_seconds() < end_time) storm_level(depth++ % DEPTHS);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) die("usage: storm THREADS SECONDS");
    int threads = atoi(argv[1]);
    if (threads < 1 || threads > MAX_THREADS) die("THREADS must be 1 to %d", MAX_THREADS);
    end_time = now_seconds() + atof(argv[2]);
    pthread_t ids[MAX_THREADS];
    for (int i = 0; i < threads; i++)
        if (pthread_create(&ids[i], NULL, storm_thread, (void *)(uintptr_t)i) != 0) die("pthread_create");
    for (int i = 0; i < threads; i++) pthread_join(ids[i], NULL);
    return 0;
}
