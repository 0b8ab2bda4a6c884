//! DHAT (`valgrind --tool=dhat`), the independent oracle of the workload's
//! counts.

use std::{collections::BTreeMap, time::Duration};

use super::{AllocSites, NO_SITE, Options, Stats, site_of, workload::TempDir};

/// What DHAT (`valgrind --tool=dhat`) counted: total bytes per site.
pub struct Dhat {
    /// Total bytes (`tb`) per [`site_of`] the program point's stack.
    pub bytes: BTreeMap<String, u64>,
    /// Allocations (`tbk`) per site.
    pub blocks: BTreeMap<String, u64>,
}

/// Runs alloc_sites under DHAT with `options` until it ends by itself and
/// returns DHAT's counts and the program's last stats.
pub fn run_under_dhat(options: Options) -> (Dhat, Stats) {
    let dir = TempDir::new("dhat");
    let output = dir.0.join("dhat.json");
    let out_arg = format!("--dhat-out-file={}", output.display());
    let mut workload = AllocSites::start_with(&["valgrind", "--tool=dhat", "--quiet", &out_arg], options);
    // Valgrind starts slowly, then the program runs its `seconds`.
    let (status, stats) = workload.wait_exit(Duration::from_secs_f64(options.seconds + 120.0));
    assert!(status.success(), "alloc_sites under valgrind failed: {status}");
    assert!(
        stats.done(),
        "alloc_sites under valgrind ended without its last stats"
    );
    let text = std::fs::read_to_string(&output)
        .unwrap_or_else(|err| panic!("reading DHAT's {}: {err}", output.display()));
    (parse_dhat(&text), stats)
}

/// DHAT's JSON: program points `pps`, each with `tb` (total bytes), `tbk`
/// (total blocks) and `fs`, its stack as indices into the frame table
/// `ftbl`, leaf first, whose strings read `0xADDR: FUNCTION (FILE:LINE)`.
pub fn parse_dhat(text: &str) -> Dhat {
    let json: serde_json::Value = serde_json::from_str(text).expect("DHAT writes JSON");
    let frames: Vec<String> = json["ftbl"]
        .as_array()
        .expect("DHAT's frame table ftbl")
        .iter()
        .map(|frame| {
            let frame = frame.as_str().unwrap_or_default();
            // "0x109F5: site_malloc_big (alloc_sites.c:133)" -> site_malloc_big
            let name = frame.split_once(": ").map_or(frame, |(_, rest)| rest);
            name.split(" (").next().unwrap_or(name).to_owned()
        })
        .collect();
    let mut bytes = BTreeMap::new();
    let mut blocks = BTreeMap::new();
    for point in json["pps"].as_array().expect("DHAT's program points pps") {
        let stack: Vec<String> = point["fs"]
            .as_array()
            .expect("a program point's stack fs")
            .iter()
            .map(|index| {
                let index = index.as_u64().expect("a frame index") as usize;
                frames.get(index).cloned().unwrap_or_default()
            })
            .collect();
        let site = site_of(&stack).unwrap_or(NO_SITE).to_owned();
        *bytes.entry(site.clone()).or_insert(0) += point["tb"].as_u64().expect("tb");
        *blocks.entry(site).or_insert(0) += point["tbk"].as_u64().expect("tbk");
    }
    Dhat { bytes, blocks }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocations::LEAK_SITE;
    #[test]
    fn parses_dhat_output() {
        let dhat = parse_dhat(
            r#"{"dhatFileVersion":2,"mode":"heap","pps":[
                {"tb":100,"tbk":2,"fs":[1,2,3]},
                {"tb":50,"tbk":1,"fs":[1,4,3]},
                {"tb":7,"tbk":1,"fs":[1,3]}],
              "ftbl":["[root]","0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_dhat-amd64-linux.so)",
                "0x1099F5: site_malloc_big (alloc_sites.c:133)","0x10A004: main (alloc_sites.c:273)",
                "0x1099F9: site_leak (alloc_sites.c:150)"]}"#,
        );
        assert_eq!(dhat.bytes.get("site_malloc_big"), Some(&100));
        assert_eq!(dhat.blocks.get("site_malloc_big"), Some(&2));
        assert_eq!(dhat.bytes.get(LEAK_SITE), Some(&50));
        assert_eq!(dhat.bytes.get(NO_SITE), Some(&7));
    }
}
