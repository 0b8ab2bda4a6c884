//! Compiles the C workloads with frame pointers in every function, the
//! unwinding workloads without them (see [`no_frame_pointer_workloads`]), and
//! tells the tests where they are.
//!
//! -O0: GCC 12 drops the frame pointer of leaf functions that need no stack
//! even with -mno-omit-leaf-frame-pointer, which hides their caller from
//! frame-pointer unwinding. The workloads' CPU splits come from instruction
//! counts, so the optimisation level does not change them.
use std::path::Path;

use anyhow::{Context as _, bail};

const WORKLOADS: &[&str] = &[
    "split",
    "threads",
    "zero_reader",
    "short_lived",
    "cpu_shares",
    "unit_pair",
    "offcpu_mix",
    "duty_cycle",
    "libc_sort",
    "wait_sites",
];
/// The fuzz test's victim is optimised code with the debug info a release
/// build has (what the symbolizer meets in the wild), as a shared object.
const FUZZ_VICTIM_FLAGS: &[&str] = &["-O2", "-g", "-fPIC", "-shared"];

/// What the hostile-input tests run as the attacker (and the root-only binary
/// they try to read): see tests/hostile_files.rs.
const ATTACKS: &[&str] = &[
    "lib_churn",
    "inode_collide",
    "many_mappings",
    "root_secret",
    "storm",
    "table_hog",
];

/// Functions in the attacker's large shared library: enough distinct code
/// that its samples keep landing on addresses the daemon has not resolved yet.
const LIBRARY_FUNCTIONS: usize = 3000;
/// A non-symbol section that brings the library to the ~8 MB of the attack.
const LIBRARY_PADDING: usize = 7 << 20;
/// push/pop pairs in the hog library's one function: each instruction moves
/// the CFA, so each is a row of its unwind table (~1.6 MB of rows).
const HOG_PAIRS: usize = 100_000;

const FLAGS: &[&str] = &[
    "-O0",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-pthread",
];

fn main() -> anyhow::Result<()> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo::rerun-if-changed=workloads/common.h");
    println!("cargo::rerun-if-changed=workloads/attack.h");
    for name in WORKLOADS.iter().chain(ATTACKS) {
        let source = format!("workloads/{name}.c");
        println!("cargo::rerun-if-changed={source}");
        let binary = out.join(name);
        cc(&[], Path::new(&source), &binary)?;
        export(name, &binary);
    }
    let source = out.join("big_library.c");
    std::fs::write(&source, big_library_source())?;
    let library = out.join("libbig.so");
    cc(&["-shared", "-fPIC"], &source, &library)?;
    export("big_library", &library);
    let source = out.join("hog_library.s");
    std::fs::write(&source, hog_library_source())?;
    let library = out.join("libhog.so");
    cc(&["-shared", "-fPIC"], &source, &library)?;
    export("hog_library", &library);
    // The benchmarks' pipe ping-pong (bench/switch_cost.sh), a switch storm
    // of ~5 us waits (tests/offcpu_sampled.rs).
    let source = "../bench/pingpong.c";
    println!("cargo::rerun-if-changed={source}");
    let binary = out.join("pingpong");
    cc(&[], Path::new(source), &binary)?;
    export("pingpong", &binary);
    // A forged CPython (tests/python.rs): its interpreter symbols exported.
    let source = "workloads/forged_python.c";
    println!("cargo::rerun-if-changed={source}");
    let binary = out.join("forged_python");
    cc(&["-rdynamic"], Path::new(source), &binary)?;
    export("forged_python", &binary);
    println!("cargo::rerun-if-changed=workloads/fuzz_victim.h");
    for (name, extra) in [("fuzz_victim", FUZZ_VICTIM_FLAGS), ("fuzz_loader", &[][..])] {
        let source = format!("workloads/{name}.c");
        println!("cargo::rerun-if-changed={source}");
        let binary = out.join(name);
        cc(extra, Path::new(&source), &binary)?;
        export(name, &binary);
    }
    no_frame_pointer_workloads(&out)
}

fn cc(extra: &[&str], source: &Path, output: &Path) -> anyhow::Result<()> {
    compile("cc", &[FLAGS, extra].concat(), source, output, &[])
}

/// `COMPILER FLAGS -o OUTPUT SOURCE LINK...`: libraries after the source
/// that needs them.
fn compile(
    compiler: &str,
    flags: &[&str],
    source: &Path,
    output: &Path,
    link: &[&str],
) -> anyhow::Result<()> {
    let status = std::process::Command::new(compiler)
        .args(flags)
        .arg("-Iworkloads")
        .arg("-o")
        .arg(output)
        .arg(source)
        .args(link)
        .status()
        .with_context(|| {
            format!(
                "running {compiler} for {} (are build-essential and g++ installed?)",
                source.display()
            )
        })?;
    if !status.success() {
        bail!("{compiler} failed for {}: {status}", source.display());
    }
    Ok(())
}

/// Optimised code as distributions and release builds ship it: no frame
/// pointers (libc and libstdc++ have none either). Symbols and line tables
/// are kept (-g only adds sections: the code is the same).
const NO_FRAME_POINTER: &[&str] = &["-O2", "-g", "-fomit-frame-pointer"];

/// The workloads of tests/unwinding.rs: stacks that only an unwinder reading
/// .eh_frame gets whole. Each source says the stack it expects.
fn no_frame_pointer_workloads(out: &Path) -> anyhow::Result<()> {
    println!("cargo::rerun-if-changed=workloads/nofp_callback.h");
    for (name, compiler, source) in [
        ("cxx_sort", "g++", "workloads/cxx_sort.cpp"),
        ("sigalrm", "cc", "workloads/sigalrm.c"),
        ("deep_recursion", "cc", "workloads/deep_recursion.c"),
        // The allocation profiler's workloads (tests/allocations.rs).
        ("alloc_sites", "cc", "workloads/alloc_sites.c"),
        ("cxx_allocs", "g++", "workloads/cxx_allocs.cpp"),
    ] {
        println!("cargo::rerun-if-changed={source}");
        let binary = out.join(name);
        compile(compiler, NO_FRAME_POINTER, Path::new(source), &binary, &[])?;
        export(name, &binary);
    }

    // A frame-pointer binary around a library without them, found through
    // its run path (no LD_LIBRARY_PATH to pass on).
    let source = "workloads/nofp_callback.c";
    println!("cargo::rerun-if-changed={source}");
    let library = out.join("libnofp_callback.so");
    let flags = [NO_FRAME_POINTER, &["-fPIC", "-shared"]].concat();
    compile("cc", &flags, Path::new(source), &library, &[])?;
    export("nofp_callback", &library);
    let source = "workloads/fp_callback.c";
    println!("cargo::rerun-if-changed={source}");
    let binary = out.join("fp_callback");
    let flags = [
        "-O2",
        "-g",
        "-fno-omit-frame-pointer",
        "-mno-omit-leaf-frame-pointer",
    ];
    let search = format!("-L{}", out.display());
    let run_path = format!("-Wl,-rpath,{}", out.display());
    let link = [search.as_str(), "-lnofp_callback", run_path.as_str()];
    compile("cc", &flags, Path::new(source), &binary, &link)?;
    export("fp_callback", &binary);

    rust_without_frame_pointers(out)?;
    stripped_static_workload(out)
}

/// A static binary with no symbol table (tests/allocations.rs): glibc's
/// malloc is in it, but nothing names it, so no allocator can be probed.
fn stripped_static_workload(out: &Path) -> anyhow::Result<()> {
    let source = "workloads/no_allocator.c";
    println!("cargo::rerun-if-changed={source}");
    let binary = out.join("no_allocator");
    compile("cc", &["-O2", "-static"], Path::new(source), &binary, &[])?;
    let status = std::process::Command::new("strip")
        .arg("--strip-all")
        .arg(&binary)
        .status()
        .context("running strip (binutils, with build-essential)")?;
    if !status.success() {
        bail!("strip failed for {}: {status}", binary.display());
    }
    export("no_allocator", &binary);
    Ok(())
}

/// rustc directly, not a [[bin]]: cargo would give it the workspace's
/// `force-frame-pointers=yes`. Release optimisation, no frame pointers,
/// symbols kept. rust_nofp is tests/unwinding.rs's, rust_allocs
/// tests/allocations.rs's.
fn rust_without_frame_pointers(out: &Path) -> anyhow::Result<()> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    for name in ["rust_nofp", "rust_allocs"] {
        let source = format!("workloads/{name}.rs");
        println!("cargo::rerun-if-changed={source}");
        let binary = out.join(name);
        let status = std::process::Command::new(&rustc)
            .args(["--edition", "2024", "-C", "opt-level=3"])
            .args(["-C", "force-frame-pointers=no", "-C", "debuginfo=1"])
            .arg("-o")
            .arg(&binary)
            .arg(&source)
            .status()
            .with_context(|| format!("running {rustc} for {source}"))?;
        if !status.success() {
            bail!("{rustc} failed for {source}: {status}");
        }
        export(name, &binary);
    }
    Ok(())
}

fn export(name: &str, path: &Path) {
    println!(
        "cargo::rustc-env=WORKLOAD_{}={}",
        name.to_uppercase(),
        path.display()
    );
}

/// Thousands of small position-independent leaf functions (no globals, no
/// calls: they run from any mapping of the file), a table of them, and a
/// padding section that is never loaded. `big_table`/`big_count` let the
/// attacker find them after dlopen.
fn big_library_source() -> String {
    let mut source = String::from("#include <stdint.h>\n");
    for i in 0..LIBRARY_FUNCTIONS {
        source.push_str(&format!(
            "__attribute__((noinline)) uint64_t big_f{i}(uint64_t x) {{ \
             for (int k = 0; k < {}; k++) x = x * {} + {i}; return x; }}\n",
            20 + i % 13,
            2 * i + 3
        ));
    }
    let table: Vec<String> = (0..LIBRARY_FUNCTIONS).map(|i| format!("big_f{i}")).collect();
    source.push_str(&format!(
        "uint64_t (*const big_table[])(uint64_t) = {{{}}};\nconst unsigned big_count = {LIBRARY_FUNCTIONS};\n",
        table.join(",")
    ));
    // Non-alloc ("" flags): in the file, after the loaded segments, never mapped.
    source.push_str(&format!(
        "__asm__(\".section .attacker_pad,\\\"\\\",@progbits\\n.fill {LIBRARY_PADDING},1,0x5a\\n.previous\");\n"
    ));
    source
}

/// One function, `hog_spin`, of [`HOG_PAIRS`] push/pop pairs, each with its
/// CFI: a small file with an enormous unwind table (issue 30).
fn hog_library_source() -> String {
    let mut source =
        String::from(".text\n.globl hog_spin\n.type hog_spin,@function\nhog_spin:\n.cfi_startproc\n");
    for _ in 0..HOG_PAIRS {
        source.push_str("push %rbx\n.cfi_adjust_cfa_offset 8\npop %rbx\n.cfi_adjust_cfa_offset -8\n");
    }
    source
        .push_str("ret\n.cfi_endproc\n.size hog_spin, .-hog_spin\n.section .note.GNU-stack,\"\",@progbits\n");
    source
}
