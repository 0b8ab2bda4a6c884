/* Sorts with glibc's qsort: most of its CPU is in msort_with_tmp, a static
 * function of glibc that libc.so.6 does not list (only its separate debug
 * file's symbol table names it). Usage: libc_sort SECONDS */
#include <stdlib.h>
#include "common.h"

#define COUNT 65536

static int values[COUNT];

static int compare(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    double end = now_seconds() + seconds_arg(argc, argv, 5);
    uint64_t x = 1;
    while (now_seconds() < end) {
        for (int i = 0; i < COUNT; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            values[i] = (int)(x >> 33);
        }
        qsort(values, COUNT, sizeof values[0], compare);
    }
    sink = x;
    return 0;
}
