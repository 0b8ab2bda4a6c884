/* The library of fp_callback.c, built -O2 -fomit-frame-pointer. */
#include <stdint.h>

typedef uint64_t (*lib_callback)(uint64_t);

/* Calls `callback` through lib_inner, a few times. */
uint64_t lib_walk(lib_callback callback, uint64_t x);
uint64_t lib_inner(lib_callback callback, uint64_t x);
