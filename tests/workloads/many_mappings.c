/* Maps COUNT distinct files of ours, each executable, then runs code from
 * them in turn. Usage: many_mappings DIR COUNT SECONDS
 * Prints "mapped COUNT files" once all are mapped. */
#include <fcntl.h>
#include "attack.h"

int main(int argc, char **argv) {
    if (argc != 4) die("usage: many_mappings DIR COUNT SECONDS");
    const char *dir = argv[1];
    long count = atol(argv[2]);
    double seconds = atof(argv[3]);
    if (count <= 0) die("COUNT must be positive");
    unsigned char **maps = calloc((size_t)count, sizeof *maps);
    if (!maps) die("calloc");
    char path[4096];
    for (long i = 0; i < count; i++) {
        snprintf(path, sizeof path, "%s/m%ld", dir, i);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0700);
        if (fd < 0 || write(fd, SPIN_STUB, sizeof SPIN_STUB) != (ssize_t)sizeof SPIN_STUB)
            die("writing %s", path);
        maps[i] = map_exec(fd, page_size());
        close(fd);
    }
    printf("mapped %ld files\n", count);
    fflush(stdout);

    /* A stride coprime with most counts walks through all of them. */
    double end = now_seconds() + seconds;
    for (long i = 0; now_seconds() < end; i = (i + 7919) % count) ((stub_fn)maps[i])();
    return 0;
}
