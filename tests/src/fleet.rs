//! What the fleet tests compare Parca's answers with: profilerd's own
//! `/top` for an explicit window, and the exact windows it pushed.

use std::collections::HashMap;

use crate::daemon::Daemon;

/// Samples per function leaf ("self") in profilerd's own `/top` for
/// [start_ms, end_ms) and `filter` (`&comm=split`, or empty), and the
/// window it answered for.
pub fn own_top(
    daemon: &Daemon,
    filter: &str,
    start_ms: u64,
    end_ms: u64,
) -> (HashMap<String, i64>, (u64, u64)) {
    let response = daemon.get(&format!(
        "/top?format=json&limit=100000&start={start_ms}&end={end_ms}{filter}"
    ));
    assert_eq!(
        response.status,
        200,
        "/top for {start_ms}..{end_ms}: {}",
        response.text()
    );
    let json: serde_json::Value = serde_json::from_slice(&response.body).expect("/top JSON");
    let mut flat = HashMap::new();
    for function in json["functions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let name = function["name"]
            .as_str()
            .unwrap_or("?")
            .trim_end_matches(" [k]")
            .to_owned();
        *flat.entry(name).or_default() += function["self"].as_i64().unwrap_or(0);
    }
    let window = (
        json["window"]["start_ms"].as_u64().unwrap_or(0),
        json["window"]["end_ms"].as_u64().unwrap_or(0),
    );
    (flat, window)
}

/// The share of `name` in `flat` (flat samples of one function over all).
pub fn share(flat: &HashMap<String, i64>, name: &str) -> f64 {
    let total: i64 = flat.values().sum();
    flat.get(name).copied().unwrap_or(0) as f64 / total.max(1) as f64
}

/// The newest drain strictly before `time_ms`, from the store's own
/// semantics: a window's answer starts just after the drain before it.
pub fn drain_before(daemon: &Daemon, time_ms: u64) -> u64 {
    let (_, (start_ms, _)) = own_top(daemon, "", time_ms, time_ms + 1);
    start_ms - 1
}

/// The exact start of a pushed window Parca reports at second `floor_ms`
/// (its query API floors times to the second) with `duration_ms`: the one
/// drain + 1 in that second whose window ends on a drain too.
pub fn exact_start(daemon: &Daemon, floor_ms: u64, duration_ms: u64) -> Option<u64> {
    let mut candidate = drain_before(daemon, floor_ms + 1000);
    while candidate + 1 >= floor_ms {
        let start = candidate + 1;
        let end = start + duration_ms;
        if drain_before(daemon, end) == end - 1 {
            return Some(start);
        }
        candidate = drain_before(daemon, candidate);
    }
    None
}
