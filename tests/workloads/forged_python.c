/* A forged CPython 3.11: exports what the daemon detects an interpreter by
 * (_PyRuntime, _PyEval_EvalFrameDefault, Py_Version = 3.11.2; built with
 * -rdynamic so they are in .dynsym) and lays out, in memory it owns, an
 * interpreter whose threads' frame chains are hostile. Every thread burns
 * CPU inside _PyEval_EvalFrameDefault (a third of a CPU each), so every
 * sample of it reaches the interpreter loop and hands off to the Python walk.
 *
 * Usage: forged_python SECONDS
 * Prints "ready" once every thread runs.
 *
 * Layout (x86_64, 3.11; ../shared/notes/interpreters.md): _PyRuntime
 * interpreters.head +0x28, gilstate.tstate_current +0x240, autoTSSkey
 * +0x250 (initialised) / +0x254 (key); interp next +0, threads.head +0x10;
 * tstate next +8, cframe +0x38 (-> current_frame +8), thread_id +0x98
 * (pthread_self); frame f_code +0x20, previous +0x30, prev_instr +0x38,
 * is_entry +0x44; code firstlineno +0x48, filename +0x70, name +0x78,
 * qualname +0x80, linetable +0x88, co_code_adaptive +0xb8; str length
 * +0x10, state +0x20, ASCII data +0x30 (compact) or a pointer at +0x48.
 *
 * The threads (each found through the thread list, the TSS key and, for
 * the first, tstate_current):
 *   cyclic     one frame whose previous is itself; its code's name claims
 *              2^31 ASCII characters followed by 8 MiB of readable 'A's,
 *              its qualname 2^31 at the end of a mapping (a guard page
 *              follows), its filename 3000 'F's, its line table 2^31 bytes
 *   pair       two frames, each the other's previous, with garbage code
 *              pointers (unmapped, misaligned, kernel half)
 *   deep       100 000 well-formed frames in a line (a depth limit cuts it)
 *   mutating   a chain whose code pointers, lengths, string kinds and links
 *              the thread rewrites as fast as it can, under the reader
 *   badstr     a code object whose strings are not compact, of kind 4,
 *              with data pointers into nowhere, and a line table whose
 *              varints never end
 *   orphan     a thread that is in no thread list and has no TSS value
 * The thread list itself is a cycle (the last tstate's next is the first),
 * and so is the interpreter list.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "common.h"

/* What the daemon detects. */
__attribute__((aligned(64))) unsigned char _PyRuntime[1 << 16];
const unsigned long Py_Version = 0x030B02F0;
/* Type objects a reader may check ob_type (+8) against; the code type's
 * tp_basicsize (+0x20) is where co_code_adaptive starts. */
__attribute__((aligned(64))) unsigned char PyCode_Type[0x1a0], PyUnicode_Type[0x1a0], PyBytes_Type[0x1a0];

enum { CYCLIC, PAIR, DEEP, MUTATING, BADSTR, ORPHAN, THREADS };
static const char *const NAMES[THREADS] = {"cyclic", "pair", "deep", "mutating", "badstr", "orphan"};

static double duration;
/* Each thread burns this long, then sleeps twice as long. */
#define BURST_NS 2000000L
static pthread_key_t tss_key;
static unsigned char *tstates[THREADS];
static unsigned char *interp;
static pthread_barrier_t started;

#define PUT(base, offset, type, value) (*(type *)((unsigned char *)(base) + (offset)) = (type)(value))

static void *arena(size_t size) {
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return memory;
}

/* A compact ASCII str of `length` claimed characters holding `text`. */
static unsigned char *ascii_str(uint64_t length, const char *text) {
    unsigned char *str = arena(4096);
    PUT(str, 0x00, uint64_t, 1);          /* ob_refcnt */
    PUT(str, 0x08, void *, PyUnicode_Type);
    PUT(str, 0x10, uint64_t, length);     /* length */
    PUT(str, 0x20, uint32_t, 0x64);       /* state: kind 1, compact, ascii */
    strcpy((char *)str + 0x30, text);
    return str;
}

/* A str claiming 2^31 characters whose data runs into a guard page. */
static unsigned char *str_at_mapping_end(void) {
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *two = arena(2 * page);
    mprotect(two + page, page, PROT_NONE);
    unsigned char *str = two + page - 0x40;
    PUT(str, 0x08, void *, PyUnicode_Type);
    PUT(str, 0x10, uint64_t, 1ULL << 31);
    PUT(str, 0x20, uint32_t, 0x64);
    memcpy(str + 0x30, "qualname", 8);
    return str;
}

/* A str claiming 2^31 characters followed by 8 MiB of readable 'A's. */
static unsigned char *str_with_long_tail(void) {
    size_t size = (8 << 20) + 4096;
    unsigned char *str = arena(size);
    PUT(str, 0x08, void *, PyUnicode_Type);
    PUT(str, 0x10, uint64_t, 1ULL << 31);
    PUT(str, 0x20, uint32_t, 0x64);
    memset(str + 0x30, 'A', size - 0x30);
    return str;
}

/* A bytes object (line table) claiming `length` bytes of `fill`. */
static unsigned char *bytes_object(uint64_t length, unsigned char fill, size_t real) {
    unsigned char *bytes = arena(0x20 + real);
    PUT(bytes, 0x08, void *, PyBytes_Type);
    PUT(bytes, 0x10, uint64_t, length);
    memset(bytes + 0x20, fill, real);
    return bytes;
}

static unsigned char *code_object(unsigned char *name, unsigned char *qualname, unsigned char *filename,
                                  unsigned char *linetable, int firstlineno) {
    unsigned char *code = arena(4096);
    PUT(code, 0x00, uint64_t, 1);
    PUT(code, 0x08, void *, PyCode_Type);
    PUT(code, 0x10, int64_t, 32); /* ob_size: code units */
    PUT(code, 0x48, int32_t, firstlineno);
    PUT(code, 0x70, void *, filename);
    PUT(code, 0x78, void *, name);
    PUT(code, 0x80, void *, qualname);
    PUT(code, 0x88, void *, linetable);
    memset(code + 0xb8, 0x97, 64); /* "bytecode" */
    return code;
}

static unsigned char *frame(void *code, void *previous, void *prev_instr, int is_entry) {
    unsigned char *f = arena(4096);
    PUT(f, 0x20, void *, code);
    PUT(f, 0x30, void *, previous);
    PUT(f, 0x38, void *, prev_instr);
    PUT(f, 0x44, uint8_t, is_entry);
    return f;
}

/* A tstate whose current frame is `current`, in no list yet. */
static unsigned char *tstate_for(unsigned char *current) {
    unsigned char *tstate = arena(4096);
    unsigned char *cframe = tstate + 0x800;
    PUT(cframe, 0x08, void *, current);
    PUT(tstate, 0x38, void *, cframe);
    PUT(tstate, 0x10, void *, interp); /* interp back pointer */
    return tstate;
}

static unsigned char *chains[THREADS];
/* What the mutating thread flips between. */
static unsigned char *mutants[2][3];
static unsigned char *mutant_frames[3];

static void build(void) {
    PUT(PyCode_Type, 0x20, int64_t, 0xb8); /* tp_basicsize */
    PUT(PyCode_Type, 0x28, int64_t, 2);    /* tp_itemsize */
    interp = arena(4096);
    PUT(interp, 0x00, void *, interp); /* next: itself */

    /* cyclic */
    unsigned char *long_table = bytes_object(1ULL << 31, 0xff, 4096);
    unsigned char *filename = arena(4096);
    PUT(filename, 0x08, void *, PyUnicode_Type);
    PUT(filename, 0x10, uint64_t, 3000);
    PUT(filename, 0x20, uint32_t, 0x64);
    memset(filename + 0x30, 'F', 3000);
    unsigned char *code = code_object(str_with_long_tail(), str_at_mapping_end(), filename, long_table, 7);
    unsigned char *self = frame(code, NULL, code + 0xb8 + 0x7ffffff0, 0);
    PUT(self, 0x30, void *, self);
    chains[CYCLIC] = self;

    /* pair: garbage code pointers */
    unsigned char *a = frame((void *)0x00007ff000000001ULL, NULL, (void *)0x10, 0);
    unsigned char *b = frame((void *)0xffff888000000000ULL, a, (void *)-1, 0);
    PUT(a, 0x30, void *, b);
    chains[PAIR] = a;

    /* deep: 100 000 well-formed frames */
    unsigned char *deep_name = ascii_str(4, "deep");
    unsigned char *deep_file = ascii_str(7, "deep.py");
    unsigned char *deep_table = bytes_object(16, 0x80, 16); /* kind 0: no line change */
    unsigned char *deep_code = code_object(deep_name, deep_name, deep_file, deep_table, 1);
    const int depth = 100000;
    unsigned char *frames = arena((size_t)depth * 0x50);
    for (int i = 0; i < depth; i++) {
        unsigned char *f = frames + (size_t)i * 0x50;
        PUT(f, 0x20, void *, deep_code);
        PUT(f, 0x30, void *, i + 1 < depth ? f + 0x50 : NULL);
        PUT(f, 0x38, void *, deep_code + 0xb8 + 2);
        PUT(f, 0x44, uint8_t, i + 1 == depth);
    }
    chains[DEEP] = frames;

    /* mutating: two versions of each of three code objects */
    for (int version = 0; version < 2; version++) {
        for (int i = 0; i < 3; i++) {
            unsigned char *name = version ? str_with_long_tail() : ascii_str(6, "mutant");
            unsigned char *table = bytes_object(version ? 1ULL << 40 : 8, 0xf8, 64);
            mutants[version][i] = code_object(name, name, ascii_str(9, "mutant.py"), table, version ? -5 : 10);
        }
    }
    for (int i = 2; i >= 0; i--)
        mutant_frames[i] = frame(mutants[0][i], i < 2 ? mutant_frames[i + 1] : NULL, mutants[0][i] + 0xb8, i == 2);
    chains[MUTATING] = mutant_frames[0];

    /* badstr: non-compact strings of kind 4 pointing nowhere, endless varints */
    unsigned char *bad = arena(4096);
    PUT(bad, 0x08, void *, PyUnicode_Type);
    PUT(bad, 0x10, uint64_t, (1ULL << 31) - 1);
    PUT(bad, 0x20, uint32_t, 4 << 2); /* kind 4, not compact, not ascii */
    PUT(bad, 0x48, uint64_t, 0xdead000000000000ULL);
    unsigned char *endless = bytes_object(4096, 0xff, 4096); /* every byte "more" */
    unsigned char *bad_code = code_object(bad, bad, bad, endless, 1 << 30);
    chains[BADSTR] = frame(bad_code, NULL, bad_code + 0xb8 + 4000, 1);

    /* orphan: a frame chain nobody can find */
    chains[ORPHAN] = frame(deep_code, NULL, deep_code + 0xb8, 1);

    for (int t = 0; t < THREADS; t++) tstates[t] = tstate_for(chains[t]);
    /* The thread list: cyclic -> pair -> deep -> mutating -> badstr -> cyclic. */
    for (int t = 0; t < ORPHAN; t++) PUT(tstates[t], 0x08, void *, tstates[(t + 1) % ORPHAN]);
    PUT(interp, 0x10, void *, tstates[CYCLIC]);
    PUT(_PyRuntime, 0x28, void *, interp);
    PUT(_PyRuntime, 0x240, void *, tstates[CYCLIC]);
    pthread_key_create(&tss_key, NULL);
    PUT(_PyRuntime, 0x250, int32_t, 1);
    PUT(_PyRuntime, 0x254, uint32_t, tss_key);
}

/* The interpreter loop every sample lands in. For the mutating thread it
 * rewrites its chain as it goes. */
__attribute__((noinline)) uint64_t _PyEval_EvalFrameDefault(int which) {
    double end = now_seconds() + duration, burst = 0;
    uint64_t x = 1, round = 0;
    const struct timespec pause = {0, BURST_NS * 2};
    for (double now = now_seconds(); now < end; now = now_seconds()) {
        if (now >= burst) {
            /* A third of a CPU each: six threads leave the real workload room. */
            nanosleep(&pause, NULL);
            burst = now_seconds() + BURST_NS / 1e9;
        }
        WORK(20000, x);
        if (which == MUTATING) {
            int version = (int)(++round & 1);
            for (int i = 0; i < 3; i++) {
                PUT(mutant_frames[i], 0x20, void *, mutants[version][i]);
                PUT(mutant_frames[i], 0x38, void *, mutants[version][i] + 0xb8 + (round % 4096));
                /* every other round, a loop through the first frame */
                PUT(mutant_frames[i], 0x30, void *,
                    i < 2 ? mutant_frames[i + 1] : (version ? mutant_frames[0] : NULL));
                PUT(mutants[version][i], 0x20, uint64_t, round * 0x9e3779b97f4a7c15ULL); /* scribble */
            }
            PUT(mutants[version][0], 0x78, void *, version ? (void *)(x | 1) : mutants[0][1]);
        }
    }
    return x;
}

static void *thread_main(void *arg) {
    int which = (int)(intptr_t)arg;
    pthread_setname_np(pthread_self(), NAMES[which]);
    PUT(tstates[which], 0x98, uint64_t, (uint64_t)pthread_self());
    if (which != ORPHAN) pthread_setspecific(tss_key, tstates[which]);
    pthread_barrier_wait(&started);
    sink = _PyEval_EvalFrameDefault(which);
    return NULL;
}

int main(int argc, char **argv) {
    duration = seconds_arg(argc, argv, 30);
    build();
    pthread_barrier_init(&started, NULL, THREADS);
    pthread_t threads[THREADS];
    for (int t = 1; t < THREADS; t++) pthread_create(&threads[t], NULL, thread_main, (void *)(intptr_t)t);
    /* The main thread is the cyclic one. */
    pthread_setname_np(pthread_self(), NAMES[CYCLIC]);
    PUT(tstates[CYCLIC], 0x98, uint64_t, (uint64_t)pthread_self());
    pthread_setspecific(tss_key, tstates[CYCLIC]);
    pthread_barrier_wait(&started);
    printf("ready\n");
    fflush(stdout);
    sink = _PyEval_EvalFrameDefault(CYCLIC);
    for (int t = 1; t < THREADS; t++) pthread_join(threads[t], NULL);
    return 0;
}
