/* Threads in rhythms the sampler can beat with (tests/cpu_exact.rs).
 *
 * A rhythm: in every period the thread runs for PERCENT of it, counted in
 * its own CPU time (CLOCK_THREAD_CPUTIME_ID), then sleeps until the next
 * period's start, an absolute CLOCK_MONOTONIC deadline that advances by the
 * period each time, so the rhythm does not drift however late a wake-up is.
 * A period equal to the sampling period keeps hitting the thread at the same
 * phase of its rhythm: always busy, or always asleep.
 *
 * duty_cycle rhythm SECONDS SPEC...
 *   One thread per SPEC, NAME:PERIOD_MS:PERCENT (PERIOD_MS may have a
 *   fraction: 10.1), named NAME, beating for SECONDS. PERCENT 100 is a
 *   thread that always runs, at nice 19: on a machine of two CPUs the
 *   rhythm threads then get the CPU the moment they want it, and keep their
 *   rhythm.
 *
 * duty_cycle exit-exec
 *   Burns 300 ms of CPU (so the sampler has seen the process, whatever its
 *   rhythm later), prints "ready", then waits for a line on its standard
 *   input. Then a
 *   thread ("exiting") beats 50% of 10.1 ms until it ran EXITING_CPU_NS,
 *   and exits; the main thread prints "exited TID CPU_NS" (the CPU time the
 *   thread read of itself just before it returned), beats 50% of 10.1 ms for
 *   MAIN_CPU_NS, and execs itself as `duty_cycle after-exec`, which beats as
 *   much again in the same thread (exec keeps the pid, the tid and the CPU
 *   time the kernel counted), prints "done", and sleeps until killed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>
#include "common.h"

#define EXIT_EXEC_PERIOD_NS 10100000LL
#define EXIT_EXEC_PERCENT 50
#define EXITING_CPU_NS 1000000000LL
#define MAIN_CPU_NS 500000000LL
#define MAX_THREADS 16

struct rhythm {
    char name[16];
    long long period_ns;
    int percent;
};

static long long end_ns;

/* Beats PERCENT of every PERIOD_NS until the thread ran CPU_BUDGET_NS more
 * (0: no budget) or the monotonic clock passed END (0: never). */
__attribute__((noinline)) void beat(long long period_ns, int percent, long long cpu_budget_ns, long long end) {
    long long burn = period_ns * percent / 100;
    long long start_cpu = thread_cpu_ns();
    long long deadline = mono_ns();
    uint64_t x = 1;
    for (;;) {
        long long from = thread_cpu_ns();
        while (thread_cpu_ns() - from < burn) WORK(500, x);
        if (cpu_budget_ns && thread_cpu_ns() - start_cpu >= cpu_budget_ns) break;
        deadline += period_ns;
        if (end && deadline >= end) break;
        struct timespec next = {deadline / 1000000000LL, deadline % 1000000000LL};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) != 0) {
        }
    }
    sink = x;
}

__attribute__((noinline)) void spin_until(long long end) {
    uint64_t x = 1;
    while (mono_ns() < end) WORK(2000, x);
    sink = x;
}

static void *run_rhythm(void *arg) {
    struct rhythm *rhythm = arg;
    pthread_setname_np(pthread_self(), rhythm->name);
    if (rhythm->percent >= 100) {
        /* Below every rhythm thread: it takes only the CPU they leave. */
        if (setpriority(PRIO_PROCESS, gettid(), 19) != 0) fail("setpriority");
        spin_until(end_ns);
    } else {
        beat(rhythm->period_ns, rhythm->percent, 0, end_ns);
    }
    return NULL;
}

static void parse_spec(const char *spec, struct rhythm *rhythm) {
    const char *colon = strchr(spec, ':');
    if (!colon || colon - spec >= (long)sizeof rhythm->name) {
        fprintf(stderr, "bad spec %s: NAME:PERIOD_MS:PERCENT, NAME of at most 15 bytes\n", spec);
        exit(2);
    }
    memcpy(rhythm->name, spec, colon - spec);
    rhythm->name[colon - spec] = 0;
    char *rest;
    double period_ms = strtod(colon + 1, &rest);
    if (*rest != ':') {
        fprintf(stderr, "bad spec %s: NAME:PERIOD_MS:PERCENT\n", spec);
        exit(2);
    }
    rhythm->period_ns = (long long)(period_ms * 1e6 + 0.5);
    rhythm->percent = atoi(rest + 1);
    if (rhythm->percent <= 0 || rhythm->percent > 100 || (rhythm->percent < 100 && rhythm->period_ns <= 0)) {
        fprintf(stderr, "bad spec %s: a period > 0 and a percentage of 1 to 100\n", spec);
        exit(2);
    }
}

static int rhythms(int argc, char **argv) {
    if (argc < 4 || argc - 3 > MAX_THREADS) {
        fprintf(stderr, "usage: duty_cycle rhythm SECONDS NAME:PERIOD_MS:PERCENT... (at most %d)\n", MAX_THREADS);
        return 2;
    }
    end_ns = mono_ns() + (long long)(atof(argv[2]) * 1e9);
    static struct rhythm specs[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int count = argc - 3;
    for (int i = 0; i < count; i++) parse_spec(argv[3 + i], &specs[i]);
    for (int i = 0; i < count; i++)
        if (pthread_create(&threads[i], NULL, run_rhythm, &specs[i]) != 0) fail("pthread_create");
    for (int i = 0; i < count; i++) pthread_join(threads[i], NULL);
    return 0;
}

struct exiting {
    long long tid, cpu_ns;
};

static void *run_exiting(void *arg) {
    struct exiting *exiting = arg;
    pthread_setname_np(pthread_self(), "exiting");
    exiting->tid = gettid();
    beat(EXIT_EXEC_PERIOD_NS, EXIT_EXEC_PERCENT, EXITING_CPU_NS, 0);
    /* The last thing it does: what the kernel counts after it is the
     * return, the thread's exit and its last switch, microseconds. */
    exiting->cpu_ns = thread_cpu_ns();
    return NULL;
}

static int exit_exec(void) {
    long long from = thread_cpu_ns();
    unsigned long x = 0;
    while (thread_cpu_ns() - from < 300000000LL) WORK(500, x);
    printf("ready\n");
    char line[64];
    if (!fgets(line, sizeof line, stdin)) fail("reading the go-ahead");
    pthread_t thread;
    static struct exiting exiting;
    if (pthread_create(&thread, NULL, run_exiting, &exiting) != 0) fail("pthread_create");
    pthread_join(thread, NULL);
    printf("exited %lld %lld\n", exiting.tid, exiting.cpu_ns);
    beat(EXIT_EXEC_PERIOD_NS, EXIT_EXEC_PERCENT, MAIN_CPU_NS, 0);
    execl("/proc/self/exe", "duty_cycle", "after-exec", (char *)NULL);
    fail("execl /proc/self/exe");
    return 1;
}

static _Noreturn void after_exec(void) {
    prctl(PR_SET_NAME, "exec-main");
    beat(EXIT_EXEC_PERIOD_NS, EXIT_EXEC_PERCENT, MAIN_CPU_NS, 0);
    printf("done\n");
    for (;;) pause();
}

int main(int argc, char **argv) {
    /* The test reads the lines as they come, through a pipe. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Wake-ups on time, not up to 50 µs late (the default slack): a 10%
     * rhythm of 1 ms runs 100 µs a period. Threads inherit it. */
    prctl(PR_SET_TIMERSLACK, 1UL);
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "rhythm") == 0) return rhythms(argc, argv);
    if (strcmp(mode, "exit-exec") == 0) return exit_exec();
    if (strcmp(mode, "after-exec") == 0) after_exec();
    fprintf(stderr, "usage: duty_cycle rhythm SECONDS NAME:PERIOD_MS:PERCENT... | exit-exec\n");
    return 2;
}
