/* Runs code from its own large shared library (thousands of functions, so its
 * samples keep hitting addresses not resolved yet) while changing that file
 * under the profiler. Usage: lib_churn truncate|retouch LIBRARY SECONDS
 *   truncate: a thread cuts the file back to its loaded segments and writes
 *             the tail back, in a loop (the code that runs is never cut);
 *   retouch:  every 0.5 s, rewrites a byte of the never-loaded padding in
 *             place (new content and mtime, same inode) and maps the file
 *             anew, running from the new mapping.
 * Prints what it did on stdout when done. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include "attack.h"

typedef uint64_t (*big_fn)(uint64_t);

static unsigned char *image;
static size_t image_size;
static int file;
static double end_time;
static volatile unsigned long toggles;

static void *truncate_loop(void *unused) {
    size_t keep = elf_loaded_end(image, image_size);
    struct timespec pause = {0, 2 * 1000 * 1000};
    (void)unused;
    while (now_seconds() < end_time) {
        if (ftruncate(file, (off_t)keep) != 0) die("ftruncate");
        nanosleep(&pause, NULL);
        if (pwrite(file, image + keep, image_size - keep, (off_t)keep) != (ssize_t)(image_size - keep))
            die("restoring the tail");
        nanosleep(&pause, NULL);
        toggles++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) die("usage: lib_churn truncate|retouch LIBRARY SECONDS");
    int truncating = strcmp(argv[1], "truncate") == 0;
    if (!truncating && strcmp(argv[1], "retouch") != 0) die("unknown mode %s", argv[1]);
    end_time = now_seconds() + atof(argv[3]);

    void *library = dlopen(argv[2], RTLD_NOW);
    if (!library) die("dlopen %s: %s", argv[2], dlerror());
    big_fn *table = dlsym(library, "big_table");
    const unsigned *count = dlsym(library, "big_count");
    Dl_info info;
    if (!table || !count || !dladdr((void *)table[0], &info)) die("big_table/big_count not found");

    file = open(argv[2], O_RDWR);
    struct stat st;
    if (file < 0 || fstat(file, &st) != 0) die("opening %s", argv[2]);
    image_size = (size_t)st.st_size;
    image = malloc(image_size);
    if (!image || pread(file, image, image_size, 0) != (ssize_t)image_size) die("reading %s", argv[2]);

    uint64_t *offsets = calloc(*count, sizeof *offsets);
    for (unsigned i = 0; i < *count; i++) {
        offsets[i] = elf_file_offset(image, image_size, (uintptr_t)table[i] - (uintptr_t)info.dli_fbase);
        if (!offsets[i]) die("no file offset for function %u", i);
    }
    uint64_t pad_size = 0;
    uint64_t pad = elf_section(image, image_size, ".attacker_pad", &pad_size);
    if (!pad || pad_size == 0) die("no .attacker_pad section");

    unsigned char *base = map_exec(file, image_size);
    pthread_t thread;
    if (truncating && pthread_create(&thread, NULL, truncate_loop, NULL) != 0) die("pthread_create");

    double next_touch = now_seconds() + 0.5;
    uint64_t x = 1;
    unsigned long retouches = 0;
    while (now_seconds() < end_time) {
        for (unsigned i = 0; i < *count; i++) x = ((big_fn)(base + offsets[i]))(x);
        if (!truncating && now_seconds() >= next_touch) {
            unsigned char byte = (unsigned char)retouches;
            if (pwrite(file, &byte, 1, (off_t)(pad + retouches % pad_size)) != 1) die("retouching");
            unsigned char *fresh = map_exec(file, image_size);
            munmap(base, image_size);
            base = fresh;
            retouches++;
            next_touch += 0.5;
        }
    }
    if (truncating) pthread_join(thread, NULL);
    sink = x;
    printf("%s: %lu truncations, %lu retouches\n", argv[1], toggles, retouches);
    return 0;
}
