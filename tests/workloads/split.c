/* Main thread: ~75% of its CPU in hot_a, ~25% in hot_b, both reached from
 * main through middle. Usage: split SECONDS
 *
 * Each round gives hot_a three times hot_b's work, but the round's length is
 * drawn at random (0.5x to 1.5x). A fixed round of ~0.75 ms is periodic, and
 * a periodic timer sampling it at 99 Hz aliases when the round drifts near a
 * divisor of the period (contention, CPU speed): the phase then sweeps too
 * slowly and 5 s of samples can land mostly in one function (81.6% hot_a was
 * seen). Random lengths keep the 3:1 split and give every sample a fresh
 * phase. */
#include <stdio.h>
#include "common.h"

#define CHUNK 200000ULL

__attribute__((noinline)) uint64_t hot_a(uint64_t x, uint64_t chunk) {
    WORK(3 * chunk, x);
    return x;
}
__attribute__((noinline)) uint64_t hot_b(uint64_t x, uint64_t chunk) {
    WORK(chunk, x);
    return x;
}

__attribute__((noinline)) void middle(double seconds) {
    double end = now_seconds() + seconds;
    uint64_t x = 1;
    uint64_t state = 0x9e3779b97f4a7c15ULL;
    while (now_seconds() < end) {
        /* xorshift64: the round's length, CHUNK/2 .. 3*CHUNK/2. */
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        uint64_t chunk = CHUNK / 2 + state % CHUNK;
        x = hot_a(x, chunk);
        x = hot_b(x, chunk);
    }
    sink = x;
}

int main(int argc, char **argv) {
    middle(seconds_arg(argc, argv, 5));
    return 0;
}
