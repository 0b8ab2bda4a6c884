// C++ new and delete, built -O2 -fomit-frame-pointer (no frame pointers;
// libstdc++'s operator new has none either). Two named functions allocate
// and free, one block each per round, 2,000 rounds a second paced by wall
// time:
//   - cxx_site_array: new char[ARRAY_BYTES] (12 KiB), delete[],
//   - cxx_site_struct: new Block (a 4-KiB struct), delete,
// so their bytes go exactly 3:1. Both reach malloc through libstdc++'s
// operator new (operator new[] calls it), so the stack of each allocation
// is malloc's caller `operator new(unsigned long)` (perhaps operator new[]
// above it), then the site. Nothing else allocates in the loop.
// Usage: cxx_allocs SECONDS
#include <cstdint>
#include <cstdlib>
#include <ctime>

static const size_t BLOCK_BYTES = 4096;
static const size_t ARRAY_BYTES = 3 * BLOCK_BYTES;
static const double ROUNDS_PER_S = 2000.0;

struct Block {
    char bytes[BLOCK_BYTES];
};

// Where the compiler cannot see a block unused: it may not drop a
// new/delete pair (C++14 lets it).
static void *volatile escape;

static double now_seconds() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

// extern "C": plain names in every symbolizer. noinline and noclone keep
// each a frame of its own; the work after `new` keeps it a call.
extern "C" __attribute__((noinline, noclone)) void cxx_site_array(uint64_t round) {
    char *block = new char[ARRAY_BYTES];
    block[0] = static_cast<char>(round);
    escape = block;
    delete[] block;
}

extern "C" __attribute__((noinline, noclone)) void cxx_site_struct(uint64_t round) {
    Block *block = new Block;
    block->bytes[0] = static_cast<char>(round);
    escape = block;
    delete block;
}

extern "C" __attribute__((noinline, noclone)) void cxx_alloc_loop(double seconds) {
    double started = now_seconds();
    uint64_t round = 0;
    for (;;) {
        double now = now_seconds() - started;
        if (now >= seconds) break;
        uint64_t due = static_cast<uint64_t>(ROUNDS_PER_S * now);
        while (round < due) {
            cxx_site_array(round);
            cxx_site_struct(round);
            round++;
        }
        timespec pause = {0, 1000000};
        nanosleep(&pause, nullptr);
    }
}

int main(int argc, char **argv) {
    cxx_alloc_loop(argc > 1 ? atof(argv[1]) : 5.0);
    return 0;
}
