/* Shared by the attack workloads: they run as an unprivileged user and must
 * fail loudly (exit 2 with a message) when the attack cannot be set up, so a
 * test never passes because its attack silently did nothing. */
#include <elf.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "common.h"

static inline void die(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "attack setup failed: ");
    vfprintf(stderr, format, args);
    fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));
    va_end(args);
    exit(2);
}

/* A position-independent leaf, as bytes so it can be written into any file
 * and run from its mapping: mov ecx, 1 << 20; 1: dec ecx; jnz 1b; ret. */
static const unsigned char SPIN_STUB[] = {0xb9, 0x00, 0x00, 0x10, 0x00, 0xff, 0xc9, 0x75, 0xfc, 0xc3};

typedef void (*stub_fn)(void);

static inline size_t page_size(void) {
    return (size_t)sysconf(_SC_PAGESIZE);
}

static inline size_t round_up(size_t value, size_t to) {
    return (value + to - 1) / to * to;
}

/* Maps `length` bytes of `fd` from offset 0, executable and private. */
static inline unsigned char *map_exec(int fd, size_t length) {
    void *map = mmap(NULL, length, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) die("mmap PROT_EXEC of %zu bytes", length);
    return map;
}

/* The file offset of virtual address `vaddr` of an ELF image held in
 * `image`, through its loadable segments; 0 if none holds it. */
static inline uint64_t elf_file_offset(const unsigned char *image, size_t size, uint64_t vaddr) {
    const Elf64_Ehdr *header = (const void *)image;
    if (size < sizeof *header || memcmp(header->e_ident, ELFMAG, SELFMAG) != 0) return 0;
    for (int i = 0; i < header->e_phnum; i++) {
        const Elf64_Phdr *segment = (const void *)(image + header->e_phoff + (size_t)i * header->e_phentsize);
        if (segment->p_type == PT_LOAD && vaddr >= segment->p_vaddr &&
            vaddr < segment->p_vaddr + segment->p_filesz)
            return vaddr - segment->p_vaddr + segment->p_offset;
    }
    return 0;
}

/* Where the loadable segments of an ELF image end in the file, page-rounded:
 * what lies beyond is never mapped by the loader. */
static inline size_t elf_loaded_end(const unsigned char *image, size_t size) {
    const Elf64_Ehdr *header = (const void *)image;
    size_t end = 0;
    if (size < sizeof *header || memcmp(header->e_ident, ELFMAG, SELFMAG) != 0) return 0;
    for (int i = 0; i < header->e_phnum; i++) {
        const Elf64_Phdr *segment = (const void *)(image + header->e_phoff + (size_t)i * header->e_phentsize);
        if (segment->p_type == PT_LOAD && segment->p_offset + segment->p_filesz > end)
            end = segment->p_offset + segment->p_filesz;
    }
    return round_up(end, page_size());
}

/* The file offset and size of the section named `name`; 0 if absent. */
static inline uint64_t elf_section(const unsigned char *image, size_t size, const char *name, uint64_t *section_size) {
    const Elf64_Ehdr *header = (const void *)image;
    if (size < sizeof *header || header->e_shoff + (size_t)header->e_shnum * sizeof(Elf64_Shdr) > size ||
        header->e_shstrndx >= header->e_shnum)
        return 0;
    const Elf64_Shdr *sections = (const void *)(image + header->e_shoff);
    const char *names = (const char *)image + sections[header->e_shstrndx].sh_offset;
    for (int i = 0; i < header->e_shnum; i++) {
        if (strcmp(names + sections[i].sh_name, name) == 0) {
            *section_size = sections[i].sh_size;
            return sections[i].sh_offset;
        }
    }
    return 0;
}
