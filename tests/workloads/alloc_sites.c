/* Allocations from known call sites, counted by the program itself: the
 * oracle of tests/allocations.rs. Built -O2 -fomit-frame-pointer (no frame
 * pointers, as distributions ship code): whole stacks need an unwinder that
 * reads .eh_frame.
 *
 * Usage: alloc_sites STATS SECONDS [MODE [LEAK_BYTES_PER_S [SITE_BYTES_PER_S]]]
 *   STATS    a file rewritten (a temporary file renamed over it) every 100 ms,
 *            and once more at exit, with `key=value` lines: pid, mode,
 *            elapsed_ns (since start), done (1 in the last one), and per
 *            site `SITE.calls` and `SITE.bytes` (cumulative, bytes as
 *            requested), `outstanding_bytes` (blocks of the non-leaking
 *            sites live now) and `max_outstanding_bytes` (the most they
 *            ever hold).
 *   SECONDS  how long it runs; it also ends once its stdin, if a pipe, is
 *            closed (so a test that dies takes it along).
 *   MODE     "all" (default): every site, paced by wall time
 *              - site_malloc_big, site_calloc_small, site_realloc_grow,
 *                site_posix_memalign: 3, 1, 2, 2 calls per batch, each of
 *                a size drawn from a fixed LCG between 1 and 64 KiB (below
 *                glibc's mmap threshold), so their bytes go 3:1:2:2. Each
 *                keeps its last RING blocks live and frees the one before:
 *                lifetimes are short but not zero.
 *                site_realloc_grow grows a block it allocated itself:
 *                realloc(NULL, 64), then realloc(p, SIZE): two calls, and
 *                its bytes are both new sizes requested (64 + SIZE), as
 *                DHAT counts them too.
 *              - site_leak: 16 KiB blocks, never freed, LEAK_BYTES_PER_S
 *                (default 64 MiB/s) until LEAK_CAP in all.
 *              The non-leaking sites allocate SITE_BYTES_PER_S (default
 *              256 MiB/s) between them.
 *            "churn": site_churn, malloc(64) then free, ~2 million pairs a
 *              second (as fast as it can when it cannot keep that pace).
 * The loops keep the pace of wall time: behind (descheduled, or slowed by
 * probes), they catch up. Nothing outside the sites allocates once main
 * runs (the stats are written with open/write/rename, not stdio). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KIB 1024ULL
#define MIB (1024ULL * KIB)
#define MIN_SIZE (1 * KIB)
#define MAX_SIZE (64 * KIB)
#define RING 4
#define REALLOC_SEED 64
#define LEAK_BLOCK (16 * KIB)
#define LEAK_CAP (2048 * MIB)
#define CHURN_SIZE 64
#define CHURN_PER_S 2000000ULL
#define CHURN_BATCH 2000
#define ALIGNMENT 64
/* At most this long in one burst of catching up before the loop looks at
 * its stats, its stdin and the clock again. */
#define BURST_S 0.005
#define STATS_SIZE 4096

enum site { MALLOC, CALLOC, REALLOC, MEMALIGN, LEAK, CHURN, SITES };

static const char *const site_names[SITES] = {
    "site_malloc_big", "site_calloc_small", "site_realloc_grow",
    "site_posix_memalign", "site_leak", "site_churn",
};

struct count {
    uint64_t calls;
    uint64_t bytes;
};

static struct count counts[SITES];
static uint64_t outstanding_bytes;

/* The live blocks of the non-leaking sites, and their sizes. */
static void *ring[MEMALIGN + 1][RING];
static uint64_t ring_size[MEMALIGN + 1][RING];
static unsigned ring_next[MEMALIGN + 1];

/* Stores the pointer where the compiler cannot see it unused: it may not
 * drop a malloc/free pair (or the churn's). */
static void *volatile escape;

static uint64_t lcg_state = 0x2545f4914f6cdd1dULL;

static uint64_t next_size(void) {
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return MIN_SIZE + (lcg_state >> 33) % (MAX_SIZE - MIN_SIZE + 1);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void out_of_memory(const char *site) {
    static const char message[] = "alloc_sites: allocation failed in ";
    (void)!write(2, message, sizeof message - 1);
    (void)!write(2, site, strlen(site));
    (void)!write(2, "\n", 1);
    _exit(2);
}

/* Keeps `block` live in its site's ring and frees the block it replaces. */
static void ring_put(enum site site, void *block, uint64_t size) {
    if (!block) out_of_memory(site_names[site]);
    escape = block;
    unsigned slot = ring_next[site];
    ring_next[site] = (slot + 1) % RING;
    if (ring[site][slot]) {
        outstanding_bytes -= ring_size[site][slot];
        free(ring[site][slot]);
    }
    ring[site][slot] = block;
    ring_size[site][slot] = size;
    outstanding_bytes += size;
}

/* The sites. noinline and noclone: each is a frame of its own, under its
 * own name. The work after each allocator call keeps it a call (no tail
 * call), so the site is the frame the allocator returns to. */

__attribute__((noinline, noclone)) void site_malloc_big(uint64_t size) {
    void *block = malloc(size);
    counts[MALLOC].calls++;
    counts[MALLOC].bytes += size;
    ring_put(MALLOC, block, size);
}

__attribute__((noinline, noclone)) void site_calloc_small(uint64_t size) {
    uint64_t members = size / 16;
    void *block = calloc(members, 16);
    counts[CALLOC].calls++;
    counts[CALLOC].bytes += members * 16;
    ring_put(CALLOC, block, members * 16);
}

__attribute__((noinline, noclone)) void site_realloc_grow(uint64_t size) {
    void *block = realloc(NULL, REALLOC_SEED);
    if (!block) out_of_memory("site_realloc_grow");
    escape = block;
    ((char *)block)[0] = 1;
    void *grown = realloc(block, size);
    counts[REALLOC].calls += 2;
    counts[REALLOC].bytes += REALLOC_SEED + size;
    ring_put(REALLOC, grown, size);
}

__attribute__((noinline, noclone)) void site_posix_memalign(uint64_t size) {
    void *block = NULL;
    if (posix_memalign(&block, ALIGNMENT, size) != 0) out_of_memory("site_posix_memalign");
    counts[MEMALIGN].calls++;
    counts[MEMALIGN].bytes += size;
    ring_put(MEMALIGN, block, size);
}

__attribute__((noinline, noclone)) void site_leak(void) {
    void *block = malloc(LEAK_BLOCK);
    if (!block) out_of_memory("site_leak");
    escape = block;
    counts[LEAK].calls++;
    counts[LEAK].bytes += LEAK_BLOCK;
}

__attribute__((noinline, noclone)) void site_churn(void) {
    for (int i = 0; i < CHURN_BATCH; i++) {
        escape = malloc(CHURN_SIZE);
        if (!escape) out_of_memory("site_churn");
        free(escape);
    }
    counts[CHURN].calls += CHURN_BATCH;
    counts[CHURN].bytes += CHURN_BATCH * CHURN_SIZE;
}

/* One batch: 3:1:2:2 calls, sizes from the LCG. Returns its bytes. */
__attribute__((noinline, noclone)) uint64_t run_batch(void) {
    uint64_t before = counts[MALLOC].bytes + counts[CALLOC].bytes + counts[REALLOC].bytes +
                      counts[MEMALIGN].bytes;
    site_malloc_big(next_size());
    site_calloc_small(next_size());
    site_realloc_grow(next_size());
    site_malloc_big(next_size());
    site_posix_memalign(next_size());
    site_realloc_grow(next_size());
    site_malloc_big(next_size());
    site_posix_memalign(next_size());
    uint64_t after = counts[MALLOC].bytes + counts[CALLOC].bytes + counts[REALLOC].bytes +
                     counts[MEMALIGN].bytes;
    return after - before;
}

static const char *stats_path;
static const char *mode_name;
static double started;

/* snprintf at `*at` of `buffer`; past its end, `*at` is left past it. */
__attribute__((format(printf, 3, 4))) static void put(char *buffer, int *at, const char *format, ...) {
    va_list args;
    va_start(args, format);
    int n = *at < STATS_SIZE ? vsnprintf(buffer + *at, STATS_SIZE - *at, format, args) : 0;
    va_end(args);
    *at = n < 0 ? STATS_SIZE : *at + n;
}

static void write_stats(int done) {
    char buffer[STATS_SIZE];
    int at = 0;
    put(buffer, &at, "pid=%d\n", (int)getpid());
    put(buffer, &at, "mode=%s\n", mode_name);
    put(buffer, &at, "elapsed_ns=%llu\n", (unsigned long long)((now_seconds() - started) * 1e9));
    put(buffer, &at, "done=%d\n", done);
    for (int site = 0; site < SITES; site++) {
        put(buffer, &at, "%s.calls=%llu\n", site_names[site], (unsigned long long)counts[site].calls);
        put(buffer, &at, "%s.bytes=%llu\n", site_names[site], (unsigned long long)counts[site].bytes);
    }
    put(buffer, &at, "outstanding_bytes=%llu\n", (unsigned long long)outstanding_bytes);
    put(buffer, &at, "max_outstanding_bytes=%llu\n", (unsigned long long)((MEMALIGN + 1) * RING * MAX_SIZE));
    if (at >= STATS_SIZE) {
        static const char message[] = "alloc_sites: stats overflow their buffer\n";
        (void)!write(2, message, sizeof message - 1);
        _exit(2);
    }
    char temporary[4096];
    snprintf(temporary, sizeof temporary, "%s.tmp", stats_path);
    int fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, buffer, at) != at || close(fd) != 0 || rename(temporary, stats_path) != 0) {
        char message[256];
        int n = snprintf(message, sizeof message, "alloc_sites: writing %s: %s\n", temporary,
                         strerror(errno));
        (void)!write(2, message, n > 0 && n < (int)sizeof message ? n : 0);
        _exit(2);
    }
}

/* Whether stdin is a pipe whose writer has closed it. */
static int watch_stdin;

static int stdin_closed(void) {
    if (!watch_stdin) return 0;
    struct pollfd fd = {.fd = 0, .events = POLLIN};
    if (poll(&fd, 1, 0) <= 0) return 0;
    char discard[256];
    ssize_t n = read(0, discard, sizeof discard);
    return n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN);
}

static void sleep_a_little(void) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000000};
    nanosleep(&ts, NULL);
}

/* The "all" mode's loop, until `seconds` have passed or stdin closed. */
__attribute__((noinline, noclone)) void run_sites(double seconds, uint64_t leak_per_s,
                                                  uint64_t sites_per_s) {
    uint64_t site_bytes = 0;
    double next_stats = 0;
    for (;;) {
        double now = now_seconds() - started;
        if (now >= seconds || stdin_closed()) break;
        double burst_end = now + BURST_S;
        uint64_t site_due = (uint64_t)(sites_per_s * now);
        while (site_bytes < site_due && now_seconds() - started < burst_end) site_bytes += run_batch();
        uint64_t leak_due = (uint64_t)(leak_per_s * now);
        if (leak_due > LEAK_CAP) leak_due = LEAK_CAP;
        while (counts[LEAK].bytes < leak_due && now_seconds() - started < burst_end) site_leak();
        if (now >= next_stats) {
            write_stats(0);
            next_stats = now + 0.1;
        }
        if (site_bytes >= site_due && counts[LEAK].bytes >= leak_due) sleep_a_little();
    }
}

/* The "churn" mode's loop. */
__attribute__((noinline, noclone)) void run_churn(double seconds) {
    double next_stats = 0;
    for (;;) {
        double now = now_seconds() - started;
        if (now >= seconds || stdin_closed()) break;
        double burst_end = now + BURST_S;
        uint64_t due = (uint64_t)(CHURN_PER_S * now);
        while (counts[CHURN].calls < due && now_seconds() - started < burst_end) site_churn();
        if (now >= next_stats) {
            write_stats(0);
            next_stats = now + 0.1;
        }
        if (counts[CHURN].calls >= due) sleep_a_little();
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s STATS SECONDS [all|churn [LEAK_BYTES_PER_S [SITE_BYTES_PER_S]]]\n",
                argv[0]);
        return 2;
    }
    stats_path = argv[1];
    double seconds = atof(argv[2]);
    mode_name = argc > 3 ? argv[3] : "all";
    uint64_t leak_per_s = argc > 4 ? strtoull(argv[4], NULL, 10) : 64 * MIB;
    uint64_t sites_per_s = argc > 5 ? strtoull(argv[5], NULL, 10) : 256 * MIB;
    struct stat st;
    watch_stdin = fstat(0, &st) == 0 && S_ISFIFO(st.st_mode);
    started = now_seconds();
    if (strcmp(mode_name, "all") == 0) {
        run_sites(seconds, leak_per_s, sites_per_s);
    } else if (strcmp(mode_name, "churn") == 0) {
        run_churn(seconds);
    } else {
        fprintf(stderr, "alloc_sites: unknown mode %s (all or churn)\n", mode_name);
        return 2;
    }
    write_stats(1);
    return 0;
}
