/* A library without frame pointers (-O2 -fomit-frame-pointer) between a
 * frame-pointer binary and its callback: see fp_callback.c. Both functions
 * use the stack and do work after their calls, so neither call becomes a
 * jump and the frames are real. */
#include "nofp_callback.h"

static volatile uint64_t lib_sink;

__attribute__((noinline, noclone)) uint64_t lib_inner(lib_callback callback, uint64_t x) {
    volatile uint64_t spill[4] = {x, x + 1, x + 2, x + 3};
    for (int i = 0; i < 4; i++)
        x = callback(x ^ spill[i]);
    lib_sink = x;
    return x + spill[0];
}

__attribute__((noinline, noclone)) uint64_t lib_walk(lib_callback callback, uint64_t x) {
    volatile uint64_t spill[2] = {x, ~x};
    x = lib_inner(callback, x + spill[1]);
    lib_sink = x;
    return x ^ spill[0];
}
