//! Builds the BPF program (profiler-ebpf) with the pinned nightly and embeds it.
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir.parent().context("workspace root")?;
    let toolchain_env = root.join("scripts/toolchain.env");
    println!("cargo::rerun-if-changed={}", toolchain_env.display());
    let toolchain = std::fs::read_to_string(&toolchain_env)
        .with_context(|| format!("reading {}", toolchain_env.display()))?
        .lines()
        .find_map(|line| line.strip_prefix("BPF_TOOLCHAIN="))
        .map(|value| value.trim().to_owned())
        .ok_or_else(|| anyhow!("BPF_TOOLCHAIN missing from {}", toolchain_env.display()))?;

    let ebpf_dir = root.join("profiler-ebpf");
    let ebpf_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "profiler-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
    .context("building the BPF program (run scripts/setup.sh first: it installs the pinned nightly and bpf-linker)")
}
