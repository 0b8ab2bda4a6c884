/* Inline helpers from a second file, so the victim's line table names more
 * than one file (a file index is one of the things the fuzz test corrupts). */
#include <stdint.h>

struct fuzz_pair {
    uint64_t low, high;
};

static inline struct fuzz_pair fuzz_split(uint64_t x) {
    struct fuzz_pair pair = {x & 0xffffffffu, x >> 32};
    return pair;
}

static inline uint64_t fuzz_join(struct fuzz_pair pair) {
    return pair.high << 32 | pair.low;
}
