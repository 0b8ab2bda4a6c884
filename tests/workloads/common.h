/* Shared helpers for the test workloads: a fixed amount of integer work per
 * call, so CPU splits come from instruction counts, not from timing; and,
 * below, the clocks and stats-file helpers of the workloads that time
 * themselves for the tests. */
#include <stdint.h>
#include <stdio.h>
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

/* Clocks in ns. */
static inline int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A field of a stats file shared with the test: stored whole, after what
 * it sums up. */
static inline void put(int64_t *field, int64_t value) {
    __atomic_store_n(field, value, __ATOMIC_RELEASE);
}

/* perror and exit(1). */
static inline void fail(const char *what) {
    perror(what);
    exit(1);
}
