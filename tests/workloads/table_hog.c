/* One user's enormous unwind tables (issue 30): loads copies of a library
 * whose one function has ~200,000 CFI rows (tests/build.rs, libhog.so; each
 * copy is a file of its own, so a table of its own) and runs through them
 * all in turn, so every copy's table is as useful as any of the others.
 * Usage: table_hog SECONDS LIBRARY... */
#define _GNU_SOURCE
#include <dlfcn.h>
#include "attack.h"

#define MAX_LIBRARIES 64

typedef void (*hog_fn)(void);

int main(int argc, char **argv) {
    if (argc < 3 || argc - 2 > MAX_LIBRARIES) die("usage: table_hog SECONDS LIBRARY... (at most %d)", MAX_LIBRARIES);
    double end_time = now_seconds() + atof(argv[1]);
    hog_fn spins[MAX_LIBRARIES];
    int count = argc - 2;
    for (int i = 0; i < count; i++) {
        void *library = dlopen(argv[i + 2], RTLD_NOW | RTLD_LOCAL);
        if (!library) die("dlopen %s: %s", argv[i + 2], dlerror());
        spins[i] = (hog_fn)dlsym(library, "hog_spin");
        if (!spins[i]) die("no hog_spin in %s", argv[i + 2]);
    }
    while (now_seconds() < end_time)
        for (int i = 0; i < count; i++) spins[i]();
    return 0;
}
