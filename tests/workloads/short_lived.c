/* Burns ~MS milliseconds of CPU in short_lived_work, then exits.
 * Usage: short_lived [MS] */
#include <stdio.h>
#include "common.h"

__attribute__((noinline)) void short_lived_work(double seconds) {
    struct timespec ts;
    uint64_t x = 1;
    for (;;) {
        WORK(20000, x);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        if (ts.tv_sec + ts.tv_nsec / 1e9 >= seconds) break;
    }
    sink = x;
}

int main(int argc, char **argv) {
    short_lived_work(seconds_arg(argc, argv, 200) / 1000.0);
    return 0;
}
