/* The native counterpart of busy.py: the same shape (a few frames deep,
 * two hot functions 3:1), no interpreter. */
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) static unsigned long hot_a(unsigned long n) {
    volatile unsigned long s = 0;
    for (unsigned long i = 0; i < n; i++) s += i * i;
    return s;
}
__attribute__((noinline)) static unsigned long hot_b(unsigned long n) {
    volatile unsigned long s = 0;
    for (unsigned long i = 0; i < n; i++) s ^= i;
    return s;
}
__attribute__((noinline)) static unsigned long depth(int k) {
    if (k == 0) return hot_a(300000) + hot_b(100000);
    return depth(k - 1) + 1;
}
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    unsigned long sink = 0;
    do {
        sink += depth(8);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return (int)(sink & 1);
}
