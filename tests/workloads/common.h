/* Shared helpers for the test workloads: a fixed amount of integer work per
 * call, so CPU splits come from instruction counts, not from timing. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static volatile uint64_t sink;

/* A macro, not a function: the named hot functions must be the leaf frames
 * (GCC omits the frame pointer of static leaf helpers, which would hide
 * their caller from frame-pointer unwinding). */
#define WORK(iterations, x)                                              \
    do {                                                                 \
        for (uint64_t i_ = 0; i_ < (iterations); i_++)                   \
            (x) = (x) * 6364136223846793005ULL + 1442695040888963407ULL; \
    } while (0)

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double seconds_arg(int argc, char **argv, double fallback) {
    return argc > 1 ? atof(argv[1]) : fallback;
}
