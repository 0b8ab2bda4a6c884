/* A root-only program (the tests install it in a 0700 directory): no user may
 * learn these names, its source path or its build id through the profiler.
 * Every function name starts with root_only_ so a leak is easy to spot. */
#include <stdio.h>
#include "common.h"

__attribute__((noinline)) uint64_t root_only_secret_function(uint64_t x) {
    WORK(1000000, x);
    return x;
}

__attribute__((noinline)) uint64_t root_only_key_derivation(uint64_t x) {
    WORK(500000, x);
    return root_only_secret_function(x);
}

int main(int argc, char **argv) {
    double end = now_seconds() + seconds_arg(argc, argv, 1);
    uint64_t x = 1;
    while (now_seconds() < end) x = root_only_key_derivation(x);
    sink = x;
    return 0;
}
