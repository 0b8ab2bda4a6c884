//! Compiles the C workloads with frame pointers in every function and tells
//! the tests where they are.
//!
//! -O0: GCC 12 drops the frame pointer of leaf functions that need no stack
//! even with -mno-omit-leaf-frame-pointer, which hides their caller from
//! frame-pointer unwinding. The workloads' CPU splits come from instruction
//! counts, so the optimisation level does not change them.
use std::path::Path;

use anyhow::{Context as _, bail};

const WORKLOADS: &[&str] = &["split", "threads", "zero_reader", "short_lived", "cpu_shares"];
/// The fuzz test's victim is optimised code with the debug info a release
/// build has (what the symbolizer meets in the wild), as a shared object.
const FUZZ_VICTIM_FLAGS: &[&str] = &["-O2", "-g", "-fPIC", "-shared"];

/// What the hostile-input tests run as the attacker (and the root-only binary
/// they try to read): see tests/hostile_files.rs.
const ATTACKS: &[&str] = &["lib_churn", "inode_collide", "many_mappings", "root_secret"];

/// Functions in the attacker's large shared library: enough distinct code
/// that its samples keep landing on addresses the daemon has not resolved yet.
const LIBRARY_FUNCTIONS: usize = 3000;
/// A non-symbol section that brings the library to the ~8 MB of the attack.
const LIBRARY_PADDING: usize = 7 << 20;

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
    println!("cargo::rerun-if-changed=workloads/fuzz_victim.h");
    for (name, extra) in [("fuzz_victim", FUZZ_VICTIM_FLAGS), ("fuzz_loader", &[][..])] {
        let source = format!("workloads/{name}.c");
        println!("cargo::rerun-if-changed={source}");
        let binary = out.join(name);
        cc(extra, Path::new(&source), &binary)?;
        export(name, &binary);
    }
    Ok(())
}

fn cc(extra: &[&str], source: &Path, output: &Path) -> anyhow::Result<()> {
    let status = std::process::Command::new("cc")
        .args(FLAGS)
        .args(extra)
        .arg("-Iworkloads")
        .arg("-o")
        .arg(output)
        .arg(source)
        .status()
        .with_context(|| {
            format!(
                "running cc for {} (is build-essential installed?)",
                source.display()
            )
        })?;
    if !status.success() {
        bail!("cc failed for {}: {status}", source.display());
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
