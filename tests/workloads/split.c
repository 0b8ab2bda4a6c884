/* Main thread: ~75% of its CPU in hot_a, ~25% in hot_b, both reached from
 * main through middle. Usage: split SECONDS */
#include <stdio.h>
#include "common.h"

#define CHUNK 200000ULL

__attribute__((noinline)) uint64_t hot_a(uint64_t x) {
    WORK(3 * CHUNK, x);
    return x;
}
__attribute__((noinline)) uint64_t hot_b(uint64_t x) {
    WORK(CHUNK, x);
    return x;
}

__attribute__((noinline)) void middle(double seconds) {
    double end = now_seconds() + seconds;
    uint64_t x = 1;
    while (now_seconds() < end) {
        x = hot_a(x);
        x = hot_b(x);
    }
    sink = x;
}

int main(int argc, char **argv) {
    middle(seconds_arg(argc, argv, 5));
    return 0;
}
