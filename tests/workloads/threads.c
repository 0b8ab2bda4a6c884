/* Two named worker threads burning CPU while main waits.
 * Usage: threads SECONDS */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include "common.h"

static double duration;

__attribute__((noinline)) void spin_worker(void) {
    double end = now_seconds() + duration;
    uint64_t x = 1;
    while (now_seconds() < end) WORK(100000, x);
    sink = x;
}

static void *worker(void *name) {
    pthread_setname_np(pthread_self(), (const char *)name);
    spin_worker();
    return NULL;
}

int main(int argc, char **argv) {
    duration = seconds_arg(argc, argv, 5);
    pthread_t a, b;
    pthread_create(&a, NULL, worker, "worker-a");
    pthread_create(&b, NULL, worker, "worker-b");
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return 0;
}
