/* A static binary, stripped (tests/build.rs): glibc's malloc is linked in
 * and used, but no symbol table names it, so the allocation profiler has
 * no allocator to probe. It allocates and frees a block every millisecond.
 * Usage: no_allocator SECONDS */
#include <stdlib.h>
#include <time.h>

static void *volatile escape;

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 60;
    struct timespec tick = {.tv_sec = 0, .tv_nsec = 1000000};
    for (long i = 0; i < (long)(seconds * 1000); i++) {
        escape = malloc(4096);
        free(escape);
        nanosleep(&tick, NULL);
    }
    return 0;
}
