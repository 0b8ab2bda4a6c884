//! Issue 28: kernel frames are named by the kernel itself (the sampler's
//! `kernel_names` program, run on demand), not by reading /proc/kallsyms
//! whole. The oracle is /proc/kallsyms as root reads it: every kernel frame
//! of a system-wide profile must carry the name of the symbol that covers
//! its address there (or one of that symbol's aliases), a return address
//! looked up one byte before it as the symbolizer does.

use std::collections::BTreeMap;

use profilerd_tests::{
    Workload,
    daemon::{Daemon, metric},
    pprof::decode,
};

const ZERO_READER: &str = env!("WORKLOAD_ZERO_READER");
/// The zero reader's name here: its syscalls bring kernel frames under
/// its own.
const NAME: &str = "kname_zeros";

/// One symbol of /proc/kallsyms.
struct Symbol {
    name: String,
    /// The module in brackets: `bpf` for a BPF program.
    module: String,
}

/// /proc/kallsyms: the symbols starting at each address (aliases share one).
fn kallsyms() -> BTreeMap<u64, Vec<Symbol>> {
    let text = std::fs::read_to_string("/proc/kallsyms").expect("reading /proc/kallsyms as root");
    let mut symbols: BTreeMap<u64, Vec<Symbol>> = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(address), Some(_kind), Some(name)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let address = u64::from_str_radix(address, 16).expect("a kallsyms address is hex");
        let module = fields
            .next()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_owned();
        let name = name.to_owned();
        symbols.entry(address).or_default().push(Symbol { name, module });
    }
    // Per-CPU symbols sit at 0 on some kernels even for root: ask for text.
    assert!(
        symbols
            .iter()
            .any(|(&address, names)| address != 0 && names.iter().any(|symbol| symbol.name == "_stext")),
        "this test reads real kernel addresses: it runs as root"
    );
    symbols
}

#[test]
fn every_kernel_frame_has_the_name_kallsyms_gives_its_address() {
    let daemon = Daemon::start(&["--frequency", "199"]);
    let reader = Workload::spawn_as(ZERO_READER, NAME, &["8"]);
    let response = daemon.get("/debug/pprof/profile?seconds=4");
    assert_eq!(response.status, 200, "{}", response.text());
    let profile = decode(&response.body);
    let symbols = kallsyms();
    drop(reader);

    // Each kernel frame as the symbolizer looks it up: the leaf at its
    // address, the frames under it (return addresses) one byte before, in
    // the call (a call to a function that does not return can be the last
    // instruction of its function). Its name as the kernel spells it.
    let mut frames: BTreeMap<u64, String> = BTreeMap::new();
    for sample in &profile.samples {
        let kernel = sample
            .frames
            .iter()
            .take_while(|frame| frame.mapping == "[kernel.kallsyms]");
        for (index, frame) in kernel.enumerate() {
            let looked_up = if index == 0 {
                frame.address
            } else {
                frame.address - 1
            };
            frames.insert(looked_up, frame.system_name.clone());
        }
    }
    assert!(
        frames.len() >= 20,
        "a system-wide profile with a process in read(2) has kernel frames: {frames:?}"
    );
    let (mut wrong, mut compared) = (Vec::new(), 0);
    for (&address, function) in &frames {
        let covering = symbols.range(..=address).next_back().map(|(_, symbols)| symbols);
        // A BPF program (another test's daemon in the suite's other lane)
        // may be unloaded, and its address reused, between the sample and
        // the read of kallsyms.
        // Nor are the kernel's own generated trampolines (kprobes, ftrace)
        // looked up as kallsyms lists them.
        let bpf = |symbols: &Vec<Symbol>| {
            symbols
                .iter()
                .any(|symbol| symbol.module == "bpf" || symbol.module.starts_with("__builtin__"))
        };
        if function.starts_with("bpf_prog_") || covering.is_some_and(bpf) {
            continue;
        }
        compared += 1;
        // Clang's LTO suffixes: the kernel's lookup drops them where kallsyms may not.
        let plain = |name: &str| name.split(".llvm.").next().unwrap_or(name).to_owned();
        if !covering.is_some_and(|symbols| {
            symbols
                .iter()
                .any(|symbol| plain(&symbol.name) == plain(function))
        }) {
            let names: Option<Vec<&str>> =
                covering.map(|symbols| symbols.iter().map(|symbol| symbol.name.as_str()).collect());
            wrong.push(format!("{address:#x}: {function:?}, kallsyms: {names:?}"));
        }
    }
    assert!(
        wrong.is_empty() && compared >= 20,
        "{} of {compared} kernel addresses named otherwise than by kallsyms:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        frames.values().any(|name| name.contains("read")),
        "the zero reader's read(2) is among the kernel frames: {frames:?}"
    );

    let metrics = daemon.get("/metrics").text();
    let by_kernel = metric(&metrics, "profilerd_kernel_addresses_named_total{by=\"kernel\"}");
    let by_kallsyms = metric(
        &metrics,
        "profilerd_kernel_addresses_named_total{by=\"kallsyms\"}",
    );
    assert!(
        by_kernel >= frames.len() as u64 && by_kallsyms == 0,
        "the kernel named {by_kernel} addresses, kallsyms {by_kallsyms}: on this kernel the BPF \
         program must run ({} kernel addresses in the profile)",
        frames.len()
    );
}
