//! The daemon's kernel memory follows the load (issue 28): with default
//! settings and a workload whose unwind tables are loaded, its BPF maps
//! lock at most 32 MiB, as the kernel reports them: the daemon's own
//! descriptors (/proc/PID/fdinfo: `memlock`, `map_type`, `max_entries`),
//! and the rows map's groups, which only that map holds (bpftool: the
//! inner map ids of its dump, each one's `bytes_memlock`).
//! The unwind rows are groups created as tables are placed, and the
//! preallocated kernel stack-trace maps are sized from the samples a drain
//! can hold, the configured entries their ceiling.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use profilerd_tests::{
    Workload,
    allocations::bpftool,
    daemon::{Daemon, metric},
    serial,
};

/// BPF_MAP_TYPE_STACK_TRACE.
const STACK_TRACE: u32 = 7;
/// BPF_MAP_TYPE_ARRAY_OF_MAPS: the unwind rows, whose groups (inner maps)
/// the daemon holds no descriptor of.
const ARRAY_OF_MAPS: u32 = 12;
/// The configured default of `kernel_stack_map_entries`.
const KERNEL_STACKS_CEILING: u64 = 8192;

/// The inner map ids in bpftool's dump of a map of maps: each entry's
/// value is the id (`inner_map_id` in newer bpftool; the value's four bytes,
/// little-endian, in bpftool 7.1).
fn inner_map_ids(dump: &serde_json::Value) -> Vec<u64> {
    let entries = dump
        .as_array()
        .unwrap_or_else(|| panic!("a dump is an array: {dump}"));
    entries
        .iter()
        .map(|entry| {
            if let Some(id) = entry["inner_map_id"].as_u64() {
                return id;
            }
            let bytes: Vec<u8> = entry["value"]
                .as_array()
                .unwrap_or_else(|| panic!("an entry without a value: {entry}"))
                .iter()
                .map(|byte| {
                    let hex = byte.as_str().and_then(|byte| byte.strip_prefix("0x"));
                    hex.and_then(|hex| u8::from_str_radix(hex, 16).ok())
                        .unwrap_or_else(|| panic!("a value byte: {byte}"))
                })
                .collect();
            let bytes: [u8; 4] = bytes
                .try_into()
                .unwrap_or_else(|bytes| panic!("a map id is 4 bytes: {bytes:?}"));
            u64::from(u32::from_le_bytes(bytes))
        })
        .collect()
}

/// The memlock of the inner maps of map `id`, as the kernel reports them.
fn inner_maps_memlock(id: u64) -> (Vec<u64>, u64) {
    let ids = inner_map_ids(&bpftool(&["map", "dump", "id", &id.to_string()]));
    let memlock = ids
        .iter()
        .map(|inner| {
            bpftool(&["map", "show", "id", &inner.to_string()])["bytes_memlock"]
                .as_u64()
                .unwrap_or_else(|| panic!("no bytes_memlock for inner map {inner}"))
        })
        .sum();
    (ids, memlock)
}

/// One map the daemon holds a descriptor for.
#[derive(Debug)]
struct HeldMap {
    map_type: u32,
    max_entries: u64,
    memlock: u64,
}

/// The maps `pid` holds descriptors for, by map id (a map held twice
/// counts once).
fn held_maps(pid: u32) -> HashMap<u64, HeldMap> {
    let mut maps = HashMap::new();
    let dir = format!("/proc/{pid}/fdinfo");
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|err| panic!("{dir}: {err}")) {
        let Ok(text) = std::fs::read_to_string(entry.expect("an fdinfo entry").path()) else {
            continue; // closed since the listing
        };
        let field = |name: &str| -> Option<u64> {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|value| value.trim().parse().ok())
        };
        let (Some(id), Some(map_type), Some(max_entries), Some(memlock)) = (
            field("map_id"),
            field("map_type"),
            field("max_entries"),
            field("memlock"),
        ) else {
            continue; // not a map
        };
        let map_type = u32::try_from(map_type).expect("a map type");
        maps.insert(
            id,
            HeldMap {
                map_type,
                max_entries,
                memlock,
            },
        );
    }
    maps
}

/// CPUs online, as the sampler counts them (/sys/devices/system/cpu/online:
/// ranges such as `0-1,4`).
fn online_cpus() -> u64 {
    let path = "/sys/devices/system/cpu/online";
    let text = std::fs::read_to_string(path).unwrap_or_else(|err| panic!("{path}: {err}"));
    text.trim()
        .split(',')
        .map(|range| {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            let number = |n: &str| {
                n.parse::<u64>()
                    .unwrap_or_else(|err| panic!("{path}: {text:?}: {err}"))
            };
            number(last) - number(first) + 1
        })
        .sum()
}

#[test]
fn the_maps_follow_the_load_within_32_mib() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    // Frame-pointer-less C++: its tables (libstdc++, libc, its own) load.
    let _workload = Workload::spawn(env!("WORKLOAD_CXX_SORT"), &["300"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        let text = daemon.get("/metrics").text();
        if metric(&text, "profilerd_unwind_table_bytes") > 0 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no unwind table loaded within 60 s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let used = metric(&metrics, "profilerd_unwind_table_bytes");
    let allocated = metric(&metrics, "profilerd_unwind_table_bytes_allocated");
    let most = metric(&metrics, "profilerd_unwind_table_bytes_max");
    eprintln!("unwind tables: {used} bytes in {allocated} bytes of groups, at most {most}");
    assert!(
        allocated >= used,
        "the groups created hold the tables loaded: {allocated} < {used}"
    );
    assert!(
        allocated < most / 4,
        "the groups follow the tables, not the maximum: {allocated} of {most}"
    );

    let maps = held_maps(daemon.pid());
    let rows: Vec<u64> = maps
        .iter()
        .filter(|(_, map)| map.map_type == ARRAY_OF_MAPS)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(rows.len(), 1, "one map of maps (the unwind rows): {maps:?}");
    let (group_ids, groups_memlock) = inner_maps_memlock(rows[0]);
    let groups = group_ids.len();
    eprintln!("{groups} groups lock {groups_memlock} bytes; the daemon reports {allocated} bytes of groups");
    assert!(groups > 0, "the rows map holds groups once tables are loaded");
    assert!(
        groups_memlock >= allocated,
        "the groups lock what the daemon says they hold: {groups_memlock} < {allocated}"
    );
    // The daemon holds the groups too (fdinfo): counted once, from bpftool.
    let held: u64 = maps
        .iter()
        .filter(|(id, _)| !group_ids.contains(id))
        .map(|(_, map)| map.memlock)
        .sum();
    let total = held + groups_memlock;
    eprintln!(
        "{} maps and {groups} groups lock {:.2} MiB; the largest held: {:?}",
        maps.len(),
        total as f64 / f64::from(1 << 20),
        {
            let mut largest: Vec<&HeldMap> = maps.values().collect();
            largest.sort_by_key(|map| std::cmp::Reverse(map.memlock));
            largest.truncate(4);
            largest
        }
    );
    assert!(
        total <= 32 << 20,
        "the daemon's maps lock {total} bytes, over 32 MiB"
    );

    // The kernel stacks' capacity as loaded, as the kernel reports it and as
    // /metrics does: 8 entries per sample a drain holds (99 Hz, 1 s
    // drains), a power of two, at least 1024, at most the ceiling. In
    // auto mode the user stack-trace maps have one entry.
    let cpus = online_cpus();
    let expected = (99 * cpus * 8)
        .max(1024)
        .next_power_of_two()
        .min(KERNEL_STACKS_CEILING);
    let kernel_stacks: Vec<u64> = maps
        .values()
        .filter(|map| map.map_type == STACK_TRACE && map.max_entries > 1)
        .map(|map| map.max_entries)
        .collect();
    assert_eq!(
        kernel_stacks,
        vec![expected; 2],
        "two kernel stack-trace maps (one per buffer) of {expected} entries"
    );
    assert_eq!(
        metric(&metrics, "profilerd_map_capacity{map=\"kernel_stacks\"}"),
        expected,
        "/metrics reports the capacity as loaded"
    );
}
