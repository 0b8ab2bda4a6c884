/* An allocation storm: malloc(SIZE), touch one byte, free, in a loop.
 * Usage: malloc_storm [-m pair|ring|split] [-s SIZE] [-c CPU] [-p] (-t SECONDS | -n PAIRS)
 *   -m pair   malloc then free at once (default);
 *   -m ring   keeps a ring of 64 live blocks: each malloc frees the block
 *             allocated 64 calls earlier, so frees are not immediate;
 *   -m split  64 mallocs, then their 64 frees, each half timed on its own:
 *             also prints ns_per_malloc and ns_per_free (the clock reads
 *             add ~1 ns per call);
 *   -c CPU    pins itself to CPU (not `taskset`, whose pinning heaptrack's
 *             and valgrind's helpers would inherit);
 *   -p        every 100 ms, prints "at CLOCK_REALTIME_NS PAIRS MALLOC_NS FREE_NS"
 *             (so far; the last two in split mode only, else 0), on the clock
 *             of bash's $EPOCHREALTIME, so a caller can take the rates over
 *             any window.
 * Last line, one machine-readable record:
 *   mode=M size=S pairs=N seconds=T pairs_per_s=R calls_per_s=2R ns_per_pair=X
 *   [ns_per_malloc=A ns_per_free=B]
 * The time is the loop's own (CLOCK_MONOTONIC), not the program's start and
 * exit, so it holds under valgrind or heaptrack too. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RING 64
#define CHECK_EVERY 256 /* pairs between clock reads (and the ring's multiple) */

/* Where the blocks go: a volatile store the compiler cannot see through, so
 * it may not fold a malloc and its free away. */
static void *volatile sink;

static long long clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *alloc(size_t size, long long i) {
    char *p = malloc(size);
    if (!p) {
        perror("malloc");
        exit(1);
    }
    ((volatile char *)p)[0] = (char)i;
    sink = p;
    return sink;
}

int main(int argc, char **argv) {
    const char *mode = "pair";
    size_t size = 64;
    double seconds = 0;
    long long count = 0;
    int progress = 0, opt;
    while ((opt = getopt(argc, argv, "m:s:c:t:n:p")) != -1) {
        switch (opt) {
        case 'c': {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(atoi(optarg), &set);
            if (sched_setaffinity(0, sizeof set, &set)) {
                perror("sched_setaffinity");
                return 1;
            }
            break;
        }
        case 'm': mode = optarg; break;
        case 's': size = strtoul(optarg, NULL, 10); break;
        case 't': seconds = atof(optarg); break;
        case 'n': count = atoll(optarg); break;
        case 'p': progress = 1; break;
        default: goto usage;
        }
    }
    int ring = !strcmp(mode, "ring"), split = !strcmp(mode, "split");
    if ((seconds <= 0) == (count <= 0) || (!ring && !split && strcmp(mode, "pair"))) goto usage;

    void *live[RING];
    for (int i = 0; i < RING; i++) live[i] = ring ? alloc(size, i) : NULL;
    long long malloc_ns = 0, free_ns = 0, pairs = 0;
    long long start = clock_ns(CLOCK_MONOTONIC), end = start + (long long)(seconds * 1e9);
    long long next_report = clock_ns(CLOCK_REALTIME) + 100000000LL;
    for (;;) {
        if (split) {
            for (int k = 0; k < CHECK_EVERY; k += RING) {
                long long t0 = clock_ns(CLOCK_MONOTONIC);
                for (int i = 0; i < RING; i++) live[i] = alloc(size, i);
                long long t1 = clock_ns(CLOCK_MONOTONIC);
                for (int i = 0; i < RING; i++) free(live[i]);
                long long t2 = clock_ns(CLOCK_MONOTONIC);
                malloc_ns += t1 - t0;
                free_ns += t2 - t1;
            }
        } else if (ring) {
            for (int i = 0; i < CHECK_EVERY; i++) {
                free(live[i % RING]);
                live[i % RING] = alloc(size, i);
            }
        } else {
            for (int i = 0; i < CHECK_EVERY; i++) free(alloc(size, i));
        }
        pairs += CHECK_EVERY;
        if (progress) {
            long long now = clock_ns(CLOCK_REALTIME);
            if (now >= next_report) {
                printf("at %lld %lld %lld %lld\n", now, pairs, malloc_ns, free_ns);
                fflush(stdout);
                next_report = now + 100000000LL;
            }
        }
        if (count > 0 ? pairs >= count : clock_ns(CLOCK_MONOTONIC) >= end) break;
    }
    long long elapsed = clock_ns(CLOCK_MONOTONIC) - start;
    if (ring)
        for (int i = 0; i < RING; i++) free(live[i]);
    double ns = split ? (double)(malloc_ns + free_ns) : (double)elapsed;
    printf("mode=%s size=%zu pairs=%lld seconds=%.3f pairs_per_s=%.0f calls_per_s=%.0f ns_per_pair=%.2f",
           mode, size, pairs, elapsed / 1e9, pairs * 1e9 / elapsed, 2 * pairs * 1e9 / elapsed, ns / pairs);
    if (split) printf(" ns_per_malloc=%.2f ns_per_free=%.2f", (double)malloc_ns / pairs, (double)free_ns / pairs);
    printf("\n");
    return 0;
usage:
    fprintf(stderr, "usage: %s [-m pair|ring|split] [-s SIZE] [-c CPU] [-p] (-t SECONDS | -n PAIRS)\n", argv[0]);
    return 2;
}
