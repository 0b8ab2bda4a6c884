/* Where a thread waits, and for how long, known to the nanosecond by the
 * workload itself (tests/offcpu.rs):
 *
 * - the main thread, named "mixworker", loops in worker_main over
 *   sleep_phase (nanosleep, ~6 ms), pipe_phase (a blocking read of one byte
 *   the "feeder" thread writes ~2.5 ms after being asked) and compute_phase
 *   (~1.5 ms of its own CPU time): ~60% / 25% / 15% of its time. It adds up
 *   the CLOCK_MONOTONIC time of each phase in the stats file.
 * - "idlereader", a child process (this program again, exec'd: its stack
 *   reaches main), settles for a second, then blocks in read on a pipe
 *   nobody writes for the rest of the run (from idle_since_ms). The second
 *   gives the profiler time to load the new program's unwind tables, as it
 *   has for any thread that idles long after its process started.
 * - with SHORT_WAITERS > 0, a "spawner" thread starts that many short
 *   waiters, one a second from 2 s on, in turn a thread ("shortthread"), a
 *   forked process that does not exec ("shortproc") and an exec'd process
 *   ("shortexec"), each sleeping ~200 ms in short_sleep, then exiting; each
 *   writes its pid, tid, life (CLOCK_REALTIME ms) and measured sleep to the
 *   stats file.
 *
 * The stats file is a MAP_SHARED mapping of little-endian int64 fields, in
 * the order of struct stats (the test reads it with read(2), which sees the
 * mapping's stores). Usage: offcpu_mix STATS_FILE SECONDS [SHORT_WAITERS]
 * (it runs itself as `offcpu_mix --idle-reader FD STATS_FILE` and
 * `offcpu_mix --short-exec STATS_FILE INDEX`). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common.h"

#define SLEEP_NS 6000000LL
#define PIPE_WAIT_NS 2500000LL
#define COMPUTE_NS 1500000LL
#define SHORT_SLEEP_NS 200000000LL
#define MAX_SHORT 16

struct short_waiter {
    int64_t pid, tid, start_ms, end_ms, slept_ns, done;
};

struct stats {
    int64_t worker_pid, worker_tid, feeder_tid, idle_reader_pid;
    int64_t iterations, sleep_ns, pipe_ns, compute_ns, total_ns;
    int64_t short_started, short_done, idle_since_ms;
    struct short_waiter shorts[MAX_SHORT];
};

static struct stats *stats;
static int request_pipe[2], data_pipe[2], idle_pipe[2];
static const char *stats_path;

static int64_t unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* A relative sleep that a signal (SIGSTOP/SIGCONT from the test) does not cut short. */
static void sleep_ns(int64_t ns) {
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

__attribute__((noinline)) void sleep_phase(void) {
    sleep_ns(SLEEP_NS);
}

__attribute__((noinline)) void pipe_phase(void) {
    char byte = 1;
    if (write(request_pipe[1], &byte, 1) != 1) fail("write request");
    while (read(data_pipe[0], &byte, 1) != 1) {
        if (errno != EINTR) fail("read data");
    }
}

__attribute__((noinline)) void compute_phase(void) {
    int64_t until = thread_cpu_ns() + COMPUTE_NS;
    uint64_t x = 1;
    while (thread_cpu_ns() < until) WORK(2000, x);
    sink = x;
}

__attribute__((noinline)) void worker_main(double seconds) {
    int64_t end = mono_ns() + (int64_t)(seconds * 1e9);
    int64_t start = mono_ns();
    while (start < end) {
        sleep_phase();
        int64_t slept = mono_ns();
        pipe_phase();
        int64_t piped = mono_ns();
        compute_phase();
        int64_t computed = mono_ns();
        put(&stats->sleep_ns, stats->sleep_ns + (slept - start));
        put(&stats->pipe_ns, stats->pipe_ns + (piped - slept));
        put(&stats->compute_ns, stats->compute_ns + (computed - piped));
        put(&stats->total_ns, stats->total_ns + (computed - start));
        put(&stats->iterations, stats->iterations + 1);
        start = computed;
    }
}

/* Answers each request ~2.5 ms later: the worker's read blocks that long. */
static void *feeder(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "feeder");
    put(&stats->feeder_tid, gettid());
    char byte;
    while (read(request_pipe[0], &byte, 1) == 1) {
        sleep_ns(PIPE_WAIT_NS);
        if (write(data_pipe[1], &byte, 1) != 1) fail("write data");
    }
    return NULL;
}

__attribute__((noinline)) void idle_read_forever(int fd) {
    char byte;
    /* Returns only at end of file: the parent (the write end) is gone. */
    while (read(fd, &byte, 1) != 0) {
    }
}

static pid_t start_idle_reader(void) {
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(idle_pipe[1]);
        char fd[16];
        snprintf(fd, sizeof fd, "%d", idle_pipe[0]);
        execl("/proc/self/exe", "offcpu_mix", "--idle-reader", fd, stats_path, (char *)NULL);
        _exit(127);
    }
    close(idle_pipe[0]);
    return pid;
}

__attribute__((noinline)) int64_t short_sleep(void) {
    int64_t start = mono_ns();
    sleep_ns(SHORT_SLEEP_NS);
    return mono_ns() - start;
}

static void short_wait(struct short_waiter *slot) {
    put(&slot->pid, getpid());
    put(&slot->tid, gettid());
    put(&slot->start_ms, unix_ms());
    put(&slot->slept_ns, short_sleep());
    put(&slot->end_ms, unix_ms());
}

static void *short_thread(void *slot) {
    pthread_setname_np(pthread_self(), "shortthread");
    short_wait(slot);
    return NULL;
}

/* An exec'd copy of this program: offcpu_mix --short-exec STATS_FILE INDEX. */
__attribute__((noinline)) void run_short_exec(int64_t index) {
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        char slot[24];
        snprintf(slot, sizeof slot, "%lld", (long long)index);
        execl("/proc/self/exe", "offcpu_mix", "--short-exec", stats_path, slot, (char *)NULL);
        _exit(127);
    }
    if (waitpid(pid, NULL, 0) != pid) fail("waitpid");
}

/* Async-signal-safe calls only in the child: it was forked from a threaded process. */
__attribute__((noinline)) void run_short_process(struct short_waiter *slot) {
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        prctl(PR_SET_NAME, "shortproc");
        short_wait(slot);
        _exit(0);
    }
    if (waitpid(pid, NULL, 0) != pid) fail("waitpid");
}

__attribute__((noinline)) void run_short_thread(struct short_waiter *slot) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, short_thread, slot) != 0) fail("pthread_create");
    pthread_join(thread, NULL);
}

static void *spawner(void *count) {
    pthread_setname_np(pthread_self(), "spawner");
    int64_t n = (int64_t)(intptr_t)count;
    int64_t first = mono_ns() + 2000000000LL;
    for (int64_t i = 0; i < n && i < MAX_SHORT; i++) {
        int64_t at = first + i * 1000000000LL;
        struct timespec ts = {at / 1000000000LL, at % 1000000000LL};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
        put(&stats->short_started, i + 1);
        if (i % 3 == 0)
            run_short_thread(&stats->shorts[i]);
        else if (i % 3 == 1)
            run_short_process(&stats->shorts[i]);
        else
            run_short_exec(i);
        put(&stats->shorts[i].done, 1);
        put(&stats->short_done, i + 1);
    }
    return NULL;
}

static void map_stats(const char *path, int flags) {
    stats_path = path;
    int fd = open(path, O_RDWR | flags, 0644);
    if (fd < 0 || ftruncate(fd, sizeof(struct stats)) != 0) fail(path);
    stats = mmap(NULL, sizeof(struct stats), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (stats == MAP_FAILED) fail("mmap");
    close(fd);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--idle-reader") == 0) {
        prctl(PR_SET_NAME, "idlereader");
        map_stats(argv[3], 0);
        sleep_ns(1000000000LL);
        put(&stats->idle_since_ms, unix_ms());
        idle_read_forever(atoi(argv[2]));
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "--short-exec") == 0) {
        prctl(PR_SET_NAME, "shortexec");
        map_stats(argv[2], 0);
        short_wait(&stats->shorts[atoi(argv[3])]);
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: offcpu_mix STATS_FILE SECONDS [SHORT_WAITERS]\n");
        return 2;
    }
    double seconds = atof(argv[2]);
    long shorts = argc > 3 ? atol(argv[3]) : 0;
    map_stats(argv[1], O_CREAT | O_TRUNC);
    if (pipe(idle_pipe)) fail("pipe");
    /* Forked while single-threaded, before the other pipes: the child must
     * not hold the request pipe's write end open (the feeder ends at its EOF). */
    put(&stats->idle_reader_pid, start_idle_reader());
    if (pipe(request_pipe) || pipe(data_pipe)) fail("pipe");
    put(&stats->worker_pid, getpid());
    put(&stats->worker_tid, gettid());
    pthread_t feeder_thread, spawner_thread;
    if (pthread_create(&feeder_thread, NULL, feeder, NULL) != 0) fail("pthread_create");
    if (shorts > 0 && pthread_create(&spawner_thread, NULL, spawner, (void *)(intptr_t)shorts) != 0)
        fail("pthread_create");
    /* After the threads are created: they would start with this name. */
    pthread_setname_np(pthread_self(), "mixworker");
    worker_main(seconds);
    close(request_pipe[1]);
    pthread_join(feeder_thread, NULL);
    if (shorts > 0) pthread_join(spawner_thread, NULL);
    kill(stats->idle_reader_pid, SIGKILL);
    waitpid(stats->idle_reader_pid, NULL, 0);
    return 0;
}
