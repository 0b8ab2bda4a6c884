// No frame pointers anywhere (built -O2 -fomit-frame-pointer; libstdc++ and
// libc have none either): main -> level_one -> level_two -> level_three,
// whose time goes to std::sort with a comparator lambda over a large vector.
// Usage: cxx_sort SECONDS [BUSY_MS PERIOD_MS]
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <vector>

static volatile uint64_t sink;

static double now_seconds() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

// extern "C": plain names in every symbolizer. noinline and noclone keep each
// a frame of its own under its own name (no .constprop copy), and each does
// work after its call so that the call is not turned into a jump.
extern "C" __attribute__((noinline, noclone)) uint64_t level_three(std::vector<uint32_t> &v,
                                                                     uint64_t seed) {
    for (auto &x : v) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        x = static_cast<uint32_t>(seed >> 33);
    }
    std::sort(v.begin(), v.end(), [](uint32_t a, uint32_t b) {
        return (a ^ 0x5a5a5a5aU) < (b ^ 0x5a5a5a5aU);
    });
    return seed ^ v[v.size() / 2];
}

extern "C" __attribute__((noinline, noclone)) uint64_t level_two(std::vector<uint32_t> &v,
                                                                   uint64_t seed) {
    uint64_t out = level_three(v, seed);
    sink = out;
    return out + 1;
}

extern "C" __attribute__((noinline, noclone)) uint64_t level_one(double seconds) {
    // Static: in bursts, only the first allocates (and zeroes 4 MB).
    static std::vector<uint32_t> v(1 << 20);
    uint64_t seed = 1;
    double end = now_seconds() + seconds;
    while (now_seconds() < end)
        seed = level_two(v, seed);
    sink = seed;
    return seed;
}

// With BUSY_MS and PERIOD_MS, it runs in bursts: busy BUSY_MS (all of it
// under level_three), then idle until the period ends.
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    if (argc > 3) {
        double busy = atof(argv[2]) / 1000, period = atof(argv[3]) / 1000;
        double end = now_seconds() + seconds;
        while (now_seconds() < end) {
            double started = now_seconds();
            sink = level_one(busy);
            double idle = period - (now_seconds() - started);
            if (idle > 0) {
                timespec pause = {static_cast<time_t>(idle), static_cast<long>((idle - static_cast<time_t>(idle)) * 1e9)};
                nanosleep(&pause, nullptr);
            }
        }
        return 0;
    }
    uint64_t out = level_one(seconds);
    sink = out;
    return 0;
}
