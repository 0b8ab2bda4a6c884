/* A stack deeper than the sampler keeps: descend() recurses 300 times, then
 * burns CPU at the bottom. Built -O2 -fomit-frame-pointer: every sample's
 * user stack is 127 frames (spin_at_bottom and 126 descend), the walk ends
 * at its depth limit, and the stack is kept with the frames found.
 * Usage: deep_recursion SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include "common.h"

#define DEPTH 300

__attribute__((noinline, noclone)) uint64_t spin_at_bottom(double end) {
    uint64_t x = sink;
    while (now_seconds() < end) {
        WORK(1000000, x);
    }
    return x;
}

/* Work after the call keeps it a call (no tail call, no loop). */
__attribute__((noinline, noclone)) uint64_t descend(int depth, double end) {
    uint64_t x = depth == 0 ? spin_at_bottom(end) : descend(depth - 1, end);
    sink = x + (uint64_t)depth;
    return x ^ (uint64_t)depth;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    double end = now_seconds() + seconds;
    while (now_seconds() < end) {
        sink = descend(DEPTH, end);
    }
    return 0;
}
