/* Spends its time in read(2) of /dev/zero: kernel frames under user frames.
 * The syscall is issued inline so read_zeros is the user leaf (libc's read
 * has no frame pointer, which would hide its caller). Usage: zero_reader SECONDS */
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "common.h"

static char buffer[1 << 20];

__attribute__((noinline)) void read_zeros(int fd, double seconds) {
    double end = now_seconds() + seconds;
    while (now_seconds() < end) {
        long ret;
        __asm__ volatile("syscall"
                         : "=a"(ret)
                         : "0"((long)SYS_read), "D"((long)fd), "S"(buffer), "d"(sizeof buffer)
                         : "rcx", "r11", "memory");
        if (ret < 0) {
            fprintf(stderr, "read: %ld\n", ret);
            exit(1);
        }
    }
}

int main(int argc, char **argv) {
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0) {
        perror("/dev/zero");
        return 1;
    }
    read_zeros(fd, seconds_arg(argc, argv, 5));
    return 0;
}
