/* The shared object the fuzz test mutates. fuzz_hot is the code the loader
 * runs from each mutant: position-independent and calling nothing, so it runs
 * from any mapping of the file whatever else in the file is corrupted (the
 * test never mutates its bytes). The other functions are there for their
 * debug info: inlined calls from another file, a struct, a loop. */
#include "fuzz_victim.h"

__attribute__((noinline)) uint64_t fuzz_hot(uint64_t x, uint64_t rounds) {
    for (uint64_t i = 0; i < rounds; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

__attribute__((noinline)) uint64_t fuzz_swap_halves(uint64_t x) {
    struct fuzz_pair pair = fuzz_split(x);
    struct fuzz_pair swapped = {pair.high, pair.low};
    return fuzz_join(swapped);
}

uint64_t fuzz_mix(const uint64_t *values, unsigned count) {
    uint64_t acc = 0;
    for (unsigned i = 0; i < count; i++)
        acc = fuzz_swap_halves(acc ^ values[i]) + fuzz_hot(values[i], 3);
    return acc;
}
