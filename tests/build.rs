//! Compiles the C workloads with frame pointers in every function and tells
//! the tests where they are.
//!
//! -O0: GCC 12 drops the frame pointer of leaf functions that need no stack
//! even with -mno-omit-leaf-frame-pointer, which hides their caller from
//! frame-pointer unwinding. The workloads' CPU splits come from instruction
//! counts, so the optimisation level does not change them.
use anyhow::{Context as _, bail};

const WORKLOADS: &[&str] = &["split", "threads", "zero_reader", "short_lived", "cpu_shares"];
const FLAGS: &[&str] = &[
    "-O0",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-pthread",
];
/// The fuzz test's victim is optimised code with the debug info a release
/// build has (what the symbolizer meets in the wild), as a shared object.
const FUZZ_VICTIM_FLAGS: &[&str] = &["-O2", "-g", "-fPIC", "-shared"];

fn main() -> anyhow::Result<()> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo::rerun-if-changed=workloads/common.h");
    for name in WORKLOADS {
        compile(&out, name, FLAGS)?;
    }
    println!("cargo::rerun-if-changed=workloads/fuzz_victim.h");
    compile(&out, "fuzz_victim", FUZZ_VICTIM_FLAGS)?;
    compile(&out, "fuzz_loader", FLAGS)?;
    Ok(())
}

/// workloads/NAME.c -> OUT_DIR/NAME, found by the tests as env!("WORKLOAD_NAME").
fn compile(out: &std::path::Path, name: &str, flags: &[&str]) -> anyhow::Result<()> {
    let source = format!("workloads/{name}.c");
    println!("cargo::rerun-if-changed={source}");
    let binary = out.join(name);
    let status = std::process::Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .status()
        .with_context(|| format!("running cc for {source} (is build-essential installed?)"))?;
    if !status.success() {
        bail!("cc failed for {source}: {status}");
    }
    println!(
        "cargo::rustc-env=WORKLOAD_{}={}",
        name.to_uppercase(),
        binary.display()
    );
    Ok(())
}
