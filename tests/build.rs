//! Compiles the C workloads with frame pointers in every function and tells
//! the tests where they are.
//!
//! -O0: GCC 12 drops the frame pointer of leaf functions that need no stack
//! even with -mno-omit-leaf-frame-pointer, which hides their caller from
//! frame-pointer unwinding. The workloads' CPU splits come from instruction
//! counts, so the optimisation level does not change them.
use anyhow::{Context as _, bail};

const WORKLOADS: &[&str] = &["split", "threads", "zero_reader", "short_lived", "cpu_shares"];

fn main() -> anyhow::Result<()> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    for name in WORKLOADS {
        let source = format!("workloads/{name}.c");
        println!("cargo::rerun-if-changed={source}");
        let binary = out.join(name);
        let status = std::process::Command::new("cc")
            .args([
                "-O0",
                "-g",
                "-fno-omit-frame-pointer",
                "-mno-omit-leaf-frame-pointer",
                "-pthread",
                "-o",
            ])
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
    }
    Ok(())
}
