// Exists so profiler-daemon can name this crate as a build-dependency (which
// makes cargo rebuild the daemon when the BPF code changes); the program itself
// is the binary in main.rs, built for bpfel-unknown-none by aya-build.
#![no_std]
