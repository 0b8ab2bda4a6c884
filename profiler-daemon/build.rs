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
    .context("building the BPF program (run scripts/setup.sh first: it installs the pinned nightly and bpf-linker)")?;
    let object = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("profiler-ebpf");
    if !object.exists() {
        // AYA_BUILD_SKIP: nothing was built (and the daemon will not embed it).
        return Ok(());
    }
    strip_dwarf(&object).with_context(|| format!("dropping the DWARF of {}", object.display()))
}

/// Drops the BPF object's DWARF sections and their relocations, in place.
///
/// bpf-linker needs the debug info only to produce BTF; the kernel and aya
/// read `.BTF` and `.BTF.ext`, never DWARF. The daemon embeds the object and
/// parses it at start: with its DWARF and their relocations the object was
/// 1.27 MB (0.75 MB of it resident in the daemon for good), 0.22 MB without.
fn strip_dwarf(path: &std::path::Path) -> anyhow::Result<()> {
    use object::build::elf::SectionData;
    let data = std::fs::read(path)?;
    let mut builder = object::build::elf::Builder::read(&*data)?;
    let mut dwarf = Vec::new();
    for section in builder.sections.iter_mut() {
        if section.name.starts_with(b".debug_") {
            section.delete = true;
            dwarf.push(section.id());
        }
    }
    // Relocation sections name the section they apply to in sh_info; one
    // that does not say so (no SHF_INFO_LINK, which LLVM sets) would keep
    // an index that renumbering makes wrong: refused rather than guessed.
    for section in builder.sections.iter_mut() {
        if matches!(section.data, SectionData::Relocation(_)) && section.sh_info_section.is_none() {
            anyhow::bail!("relocation section {} names no section", section.name);
        }
        if section
            .sh_info_section
            .is_some_and(|target| dwarf.contains(&target))
        {
            section.delete = true;
        }
    }
    // Relocations left in kept sections must not have named DWARF's symbols.
    let kept_relocations = |builder: &object::build::elf::Builder| -> usize {
        builder
            .sections
            .iter()
            .filter(|section| !section.delete)
            .map(|section| match &section.data {
                SectionData::Relocation(relocations) => relocations.len(),
                _ => 0,
            })
            .sum()
    };
    let before = kept_relocations(&builder);
    builder.delete_orphans();
    anyhow::ensure!(
        kept_relocations(&builder) == before,
        "dropping the DWARF would drop relocations of the code or BTF"
    );
    // LLVM names sections out of the symbols' string table; the writer
    // wants a section-name table of its own.
    if !builder
        .sections
        .iter()
        .any(|section| matches!(section.data, SectionData::SectionString))
    {
        let names = builder.sections.add();
        names.name = b".shstrtab".as_slice().into();
        names.sh_type = object::elf::SHT_STRTAB;
        names.sh_addralign = 1;
        names.data = SectionData::SectionString;
    }
    let mut stripped = Vec::new();
    builder.write(&mut stripped)?;
    std::fs::write(path, stripped)?;
    Ok(())
}
