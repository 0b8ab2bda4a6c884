/* Most of its time in a signal handler: SIGALRM every 1 ms (ITIMER_REAL),
 * whose handler burns ~0.8 ms in hot_in_handler, interrupting
 * interrupted_loop. Built -O2 -fomit-frame-pointer: the stacks to expect are
 * hot_in_handler <- alarm_handler <- __restore_rt <- interrupted_loop <- main.
 * Usage: sigalrm SECONDS */
#include <signal.h>
#include <stdio.h>
#include <sys/time.h>
#include "common.h"

/* Iterations of WORK worth ~0.8 ms, measured before the timer starts. */
static uint64_t handler_work;
static volatile uint64_t handled;

__attribute__((noinline, noclone)) uint64_t hot_in_handler(uint64_t x) {
    WORK(handler_work, x);
    return x;
}

/* Stores after the call: the call stays a call, not a jump, so the handler
 * keeps a frame of its own. */
__attribute__((noinline, noclone)) void alarm_handler(int signo) {
    sink = hot_in_handler(sink + (uint64_t)signo);
    handled = handled + 1;
}

/* Reads the clock only every few million steps: nearly all of its time is in
 * its own code, where the signal lands. */
__attribute__((noinline, noclone)) uint64_t interrupted_loop(double seconds) {
    double end = now_seconds() + seconds;
    uint64_t x = 1;
    while (now_seconds() < end)
        WORK(4000000ULL, x);
    return x;
}

/* On CPU time, not wall time: on a busy machine the workload is descheduled
 * during the measurement, which would make the handler's share depend on
 * the load. */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void calibrate(void) {
    const uint64_t probe = 2000000;
    double best = 1e9;
    uint64_t x = 1;
    for (int round = 0; round < 5; round++) {
        double start = cpu_seconds();
        WORK(probe, x);
        double took = cpu_seconds() - start;
        if (took < best)
            best = took;
    }
    sink = x;
    handler_work = (uint64_t)(probe * 0.0008 / (best > 1e-6 ? best : 1e-6));
}

int main(int argc, char **argv) {
    double seconds = seconds_arg(argc, argv, 5);
    calibrate();
    struct sigaction action = {0};
    action.sa_handler = alarm_handler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (sigaction(SIGALRM, &action, NULL) != 0) {
        perror("sigaction");
        return 1;
    }
    struct itimerval every_ms = {{0, 1000}, {0, 1000}};
    if (setitimer(ITIMER_REAL, &every_ms, NULL) != 0) {
        perror("setitimer");
        return 1;
    }
    uint64_t out = interrupted_loop(seconds);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    sink = out;
    printf("%llu signals handled\n", (unsigned long long)handled);
    return 0;
}
