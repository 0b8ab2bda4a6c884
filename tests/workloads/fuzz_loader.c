/* Runs fuzz_hot from each file named in LIST (one path a line), each mapped
 * PROT_READ|PROT_EXEC at the page holding the function, for CPU_US
 * microseconds of this thread's CPU time (so it is sampled whatever the
 * machine's load), keeping the last KEEP mappings so the profiler can still
 * read them when it symbolizes. Stops after DEADLINE_S seconds of wall time.
 * Prints the index of each file done, then "done N" and the result.
 * Usage: fuzz_loader LIST HOT_OFFSET CPU_US KEEP DEADLINE_S */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef uint64_t (*hot_fn)(uint64_t, uint64_t);

/* Far from the heap, the stack and the libraries of a default x86-64 layout. */
#define FRESH_BASE 0x300000000000ULL

static double clock_seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: fuzz_loader LIST HOT_OFFSET CPU_US KEEP DEADLINE_S\n");
        return 2;
    }
    FILE *list = fopen(argv[1], "r");
    if (!list) {
        perror(argv[1]);
        return 1;
    }
    uint64_t hot = strtoull(argv[2], NULL, 0);
    double cpu_s = atof(argv[3]) / 1e6;
    long keep = atol(argv[4]);
    double deadline = clock_seconds(CLOCK_MONOTONIC) + atof(argv[5]);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t map_offset = hot & ~(page - 1);
    /* Two pages: the function may straddle a page boundary. */
    size_t length = 2 * page;
    void **kept = calloc(keep > 0 ? keep : 1, sizeof *kept);
    char path[4096];
    uint64_t acc = 1;
    unsigned long done = 0;
    while (fgets(path, sizeof path, list) && clock_seconds(CLOCK_MONOTONIC) < deadline) {
        path[strcspn(path, "\n")] = 0;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            perror(path);
            return 1;
        }
        /* A fresh address for every file: a mapping that replaced an older
           one at the same address could be taken for it by the profiler. */
        void *at = (char *)FRESH_BASE + done * length;
        void *mapping = mmap(at, length, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd,
                             (off_t)map_offset);
        close(fd);
        if (mapping == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        hot_fn run = (hot_fn)((char *)mapping + (hot - map_offset));
        double start = clock_seconds(CLOCK_THREAD_CPUTIME_ID);
        while (clock_seconds(CLOCK_THREAD_CPUTIME_ID) - start < cpu_s)
            acc = run(acc, 20000);
        long slot = (long)(done % (unsigned long)keep);
        if (kept[slot])
            munmap(kept[slot], length);
        kept[slot] = mapping;
        printf("%lu\n", done++);
        fflush(stdout);
    }
    printf("done %lu %llx\n", done, (unsigned long long)acc);
    return 0;
}
