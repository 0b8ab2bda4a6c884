/* Two call sites that wait, in a switch storm (tests/offcpu_sampled.rs):
 * the split of off-CPU time between them, known to the workload itself.
 *
 * The main thread ("sitewaiter") asks the "answerer" thread for a byte over
 * a pipe and blocks reading the answer: one request in four in
 * long_wait_site, the other three in short_wait_site. The answerer spins
 * LONG_SPIN_NS or SHORT_SPIN_NS before it answers, so a long wait lasts ~9x
 * a short one: long_wait_site has a quarter of the waits and ~75% of the
 * time waited (~73% measured: each wait also holds the switches' own
 * cost). Pinned to one CPU (the test runs it under taskset), the two
 * threads switch ~19,000 times a second, enough to put the default off-CPU
 * budget's sampling to work.
 *
 * The stats file is a MAP_SHARED mapping of little-endian int64 fields, in
 * the order of struct stats: each site's waits and the CLOCK_MONOTONIC ns
 * from its request's write to the end of its read, added up after every
 * wait (on one CPU the woken answerer may take the CPU inside the write).
 * Usage: wait_sites STATS_FILE SECONDS */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>
#include "common.h"

#define LONG_SPIN_NS 300000LL
#define SHORT_SPIN_NS 33000LL

struct stats {
    int64_t pid, waiter_tid, answerer_tid;
    int64_t long_waits, long_ns, short_waits, short_ns;
};

static struct stats *stats;
static int request_pipe[2], answer_pipe[2];

static void read_byte(int fd, char *byte) {
    while (read(fd, byte, 1) != 1) {
        if (errno != EINTR) fail("read");
    }
}

/* Asks for an answer after the answerer's LONG or SHORT spin; the wait is
 * timed from before the request's write. Returns its ns. */
static int64_t ask(char spin) {
    int64_t start = mono_ns();
    if (write(request_pipe[1], &spin, 1) != 1) fail("write request");
    char answer;
    read_byte(answer_pipe[0], &answer);
    return mono_ns() - start;
}

__attribute__((noinline)) int64_t long_wait_site(void) {
    return ask('L');
}

__attribute__((noinline)) int64_t short_wait_site(void) {
    return ask('S');
}

static void *answerer(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "answerer");
    put(&stats->answerer_tid, gettid());
    for (;;) {
        char request;
        read_byte(request_pipe[0], &request);
        int64_t until = mono_ns() + (request == 'L' ? LONG_SPIN_NS : SHORT_SPIN_NS);
        uint64_t x = 1;
        while (mono_ns() < until) WORK(50, x);
        sink = x;
        if (write(answer_pipe[1], &request, 1) != 1) fail("write answer");
    }
    return NULL;
}

__attribute__((noinline)) void waiter_main(double seconds) {
    int64_t end = mono_ns() + (int64_t)(seconds * 1e9);
    for (uint64_t round = 0; mono_ns() < end; round++) {
        if (round % 4 == 0) {
            int64_t waited = long_wait_site();
            put(&stats->long_ns, stats->long_ns + waited);
            put(&stats->long_waits, stats->long_waits + 1);
        } else {
            int64_t waited = short_wait_site();
            put(&stats->short_ns, stats->short_ns + waited);
            put(&stats->short_waits, stats->short_waits + 1);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: wait_sites STATS_FILE SECONDS\n");
        return 2;
    }
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) fail("open stats");
    if (ftruncate(fd, sizeof(struct stats)) != 0) fail("ftruncate");
    stats = mmap(NULL, sizeof(struct stats), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (stats == MAP_FAILED) fail("mmap");
    prctl(PR_SET_NAME, "sitewaiter");
    put(&stats->pid, getpid());
    put(&stats->waiter_tid, gettid());
    if (pipe(request_pipe) != 0 || pipe(answer_pipe) != 0) fail("pipe");
    pthread_t thread;
    if (pthread_create(&thread, NULL, answerer, NULL) != 0) fail("pthread_create");
    waiter_main(atof(argv[2]));
    return 0;
}
