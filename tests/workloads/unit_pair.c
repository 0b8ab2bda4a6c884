/* Two processes (this one and a forked child) spinning in the function named
 * by the first argument until each has used SECONDS of CPU (its own CPU
 * time, not wall time: a busy machine only makes it take longer).
 * Usage: unit_pair alpha|beta|gamma|delta|epsilon SECONDS */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common.h"

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

#define SPIN(name)                                         \
    __attribute__((noinline)) void name(double seconds) {  \
        uint64_t x = 1;                                    \
        while (cpu_seconds() < seconds)                    \
            WORK(100000ULL, x);                            \
        sink = x;                                          \
    }

SPIN(spin_alpha)
SPIN(spin_beta)
SPIN(spin_gamma)
SPIN(spin_delta)
SPIN(spin_epsilon)

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "alpha";
    double seconds = argc > 2 ? atof(argv[2]) : 5;
    void (*spin)(double) = spin_alpha;
    if (!strcmp(which, "beta")) spin = spin_beta;
    if (!strcmp(which, "gamma")) spin = spin_gamma;
    if (!strcmp(which, "delta")) spin = spin_delta;
    if (!strcmp(which, "epsilon")) spin = spin_epsilon;
    pid_t child = fork();
    spin(seconds);
    if (child > 0) waitpid(child, NULL, 0);
    return 0;
}
