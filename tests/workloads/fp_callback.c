/* A frame-pointer binary (-O2 -fno-omit-frame-pointer) that calls into a
 * library built without frame pointers (libnofp_callback.so), which calls
 * back into the binary, where the time goes:
 * main -> fp_caller -> lib_walk -> lib_inner -> fp_callback.
 * Usage: fp_callback SECONDS */
#include <stdio.h>
#include "common.h"
#include "nofp_callback.h"

/* The volatile slot gives it a stack frame: GCC 12 leaves the frame pointer
 * out of a leaf that needs none, even with -mno-omit-leaf-frame-pointer. */
__attribute__((noinline, noclone)) uint64_t fp_callback(uint64_t x) {
    volatile uint64_t start = x;
    WORK(200000ULL, x);
    return x ^ start;
}

__attribute__((noinline, noclone)) uint64_t fp_caller(double seconds) {
    double end = now_seconds() + seconds;
    uint64_t x = 1;
    while (now_seconds() < end)
        x = lib_walk(fp_callback, x);
    sink = x;
    return x + 1;
}

int main(int argc, char **argv) {
    sink = fp_caller(seconds_arg(argc, argv, 5));
    return 0;
}
