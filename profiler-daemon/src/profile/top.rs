//! The hottest functions, like `perf report --no-children` plus inclusive
//! columns: self = the sample's leaf function, total = anywhere in its stack
//! (once per sample, however deep the recursion). Counted in the profile's
//! value ([`Profile::value`]): samples for CPU, nanoseconds for off-CPU and wall.

use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use super::Profile;
use crate::{
    kind::ViewValue,
    symbolize::{FrameKind, SymbolizedStack},
};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FunctionCost {
    /// The function's name; kernel functions end in ` [k]`.
    pub name: String,
    /// The value of the samples whose leaf is this function.
    #[serde(rename = "self")]
    pub self_value: u64,
    /// The value of the samples with this function anywhere in their stack.
    #[serde(rename = "total")]
    pub total_value: u64,
    /// CPU profiles only (their values are samples): the measured CPU time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_cpu_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_cpu_ns: Option<u64>,
}

/// Functions sorted by self value (then total, then name), at most `limit`.
pub fn top(profile: &Profile, limit: usize) -> Vec<FunctionCost> {
    // Samples of many threads and drains share one interned stack: walk each
    // distinct stack once, with its summed value and time.
    let mut stacks: HashMap<*const SymbolizedStack, (&SymbolizedStack, u64, u64)> = HashMap::new();
    for sample in &profile.samples {
        let entry = stacks
            .entry(Arc::as_ptr(&sample.stack))
            .or_insert((&sample.stack, 0, 0));
        entry.1 += profile.value(sample);
        entry.2 += sample.amount;
    }
    let cpu_ns = |ns| (!profile.profile_type.counts_time()).then_some(ns);
    let mut costs: HashMap<String, FunctionCost> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    for (stack, value, ns) in stacks.into_values() {
        names.clear();
        names.extend(
            stack
                .frames_root_first()
                .map(|(name, kind, _)| display_name(name, kind)),
        );
        if let Some(leaf) = names.last() {
            let cost = cost_of(&mut costs, leaf.clone());
            cost.self_value += value;
            cost.self_cpu_ns = cpu_ns(cost.self_cpu_ns.unwrap_or(0) + ns);
        }
        // A recursive function is on the stack once for this sample's purposes.
        names.sort_unstable();
        names.dedup();
        for name in names.drain(..) {
            let cost = cost_of(&mut costs, name);
            cost.total_value += value;
            cost.total_cpu_ns = cpu_ns(cost.total_cpu_ns.unwrap_or(0) + ns);
        }
    }
    let mut costs: Vec<FunctionCost> = costs.into_values().collect();
    costs.sort_by(|a, b| {
        b.self_value
            .cmp(&a.self_value)
            .then(b.total_value.cmp(&a.total_value))
            .then(a.name.cmp(&b.name))
    });
    costs.truncate(limit);
    costs
}

fn cost_of(costs: &mut HashMap<String, FunctionCost>, name: String) -> &mut FunctionCost {
    costs.entry(name).or_insert_with_key(|name| FunctionCost {
        name: name.clone(),
        ..FunctionCost::default()
    })
}

fn display_name(name: &str, kind: FrameKind) -> String {
    match kind {
        FrameKind::Kernel => format!("{name} [k]"),
        FrameKind::User => name.to_owned(),
    }
}

/// A text table, `perf report` style.
pub fn table(profile: &Profile, costs: &[FunctionCost]) -> String {
    let total_value = profile.total_value();
    let total = total_value.max(1);
    let description = profile.profile_type.describe();
    let what = match description.views_count {
        ViewValue::Amount => format!(
            "{total_value} {} of {} time ({}), in {}",
            description.unit.short(),
            description.title,
            description.unit.human(total_value),
            description.unit.pprof_name()
        ),
        ViewValue::Count => format!("{total_value} samples"),
    };
    // Nanosecond columns are wider than sample counts.
    let width = total_value.to_string().len().max(8);
    let mut out = format!(
        "# {what}; self = leaf function, total = anywhere in the stack\n{:>8} {:>8} {:>width$} {:>width$}  {}\n",
        "self%", "total%", "self", "total", "function"
    );
    for cost in costs {
        out.push_str(&format!(
            "{:>7.2}% {:>7.2}% {:>width$} {:>width$}  {}\n",
            cost.self_value as f64 * 100.0 / total as f64,
            cost.total_value as f64 * 100.0 / total as f64,
            cost.self_value,
            cost.total_value,
            printable(&cost.name)
        ));
    }
    out
}

/// A name as one line of the table: a process can name its functions with
/// newlines or terminal escapes; those are shown escaped, not obeyed.
fn printable(name: &str) -> String {
    let mut shown = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        kind::{ProfileType, SampleKind},
        profile::Window,
        symbolize::{Function, Line, Location, SymbolizedSample, SymbolizedStack},
    };

    fn stack(frames: &[(&str, FrameKind)]) -> Arc<SymbolizedStack> {
        // Leaf first, as the symbolizer builds them.
        Arc::new(SymbolizedStack {
            locations: frames
                .iter()
                .map(|(name, kind)| Location {
                    kind: *kind,
                    address: 0,
                    mapping: None,
                    lines: Arc::new([Line {
                        function: Arc::new(Function {
                            name: (*name).into(),
                            system_name: (*name).into(),
                            filename: None,
                        }),
                        line: 0,
                    }]),
                    resolved: true,
                })
                .collect(),
        })
    }

    fn profile(samples: Vec<(Arc<SymbolizedStack>, u64)>) -> Profile {
        Profile {
            window: Window::ALL,
            frequency: 99,
            alloc_interval: 0,
            profile_type: ProfileType::Cpu,
            samples: samples
                .into_iter()
                .map(|(stack, count)| SymbolizedSample {
                    kind: SampleKind::Cpu,
                    pid: 1,
                    tid: 1,
                    comm: "w".into(),
                    readable_by: crate::collect::ReadableBy::Privileged,
                    thread_name: "w".into(),
                    stack,
                    count,
                    amount: count * 10,
                    cgroup: None,
                    ns_pid: None,
                })
                .collect(),
        }
    }

    #[test]
    fn self_is_the_leaf_total_is_anywhere_once_per_sample() {
        use FrameKind::{Kernel, User};
        let profile = profile(vec![
            (stack(&[("hot_a", User), ("middle", User), ("main", User)]), 3),
            (
                stack(&[
                    ("read_zero", Kernel),
                    ("recurse", User),
                    ("recurse", User),
                    ("main", User),
                ]),
                2,
            ),
        ]);
        let costs = top(&profile, 10);
        let get = |name: &str| costs.iter().find(|c| c.name == name).cloned().unwrap_or_default();
        assert_eq!(costs[0].name, "hot_a", "sorted by self: {costs:?}");
        assert_eq!((get("hot_a").self_value, get("hot_a").total_value), (3, 3));
        assert_eq!(
            (
                get("main").self_value,
                get("main").total_value,
                get("main").total_cpu_ns
            ),
            (0, 5, Some(50))
        );
        assert_eq!(get("recurse").total_value, 2, "recursion counts once per sample");
        assert_eq!(get("read_zero [k]").self_value, 2, "kernel frames are marked");
        assert_eq!(top(&profile, 2).len(), 2, "limit applies");
    }

    #[test]
    fn samples_sharing_a_stack_add_up() {
        use FrameKind::User;
        let shared = stack(&[("leaf", User), ("main", User)]);
        let profile = profile(vec![(shared.clone(), 4), (shared, 6)]);
        let costs = top(&profile, 10);
        let leaf = costs
            .iter()
            .find(|c| c.name == "leaf")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            (
                leaf.self_value,
                leaf.total_value,
                leaf.self_cpu_ns,
                leaf.total_cpu_ns
            ),
            (10, 10, Some(100), Some(100))
        );
    }

    #[test]
    fn off_cpu_functions_cost_nanoseconds() {
        use FrameKind::User;
        let mut profile = profile(vec![
            (stack(&[("poll", User), ("main", User)]), 3),
            (stack(&[("main", User)]), 1),
        ]);
        profile.profile_type = ProfileType::OffCpu;
        let costs = top(&profile, 10);
        assert_eq!(
            costs[1],
            FunctionCost {
                name: "main".into(),
                self_value: 10,
                total_value: 40,
                self_cpu_ns: None,
                total_cpu_ns: None,
            },
            "self and total are waited ns (10 per wait here), sorted by self: {costs:?}"
        );
        let table = table(&profile, &costs);
        assert!(
            table.starts_with("# 40 ns of off-CPU time (0.000 s), in nanoseconds;"),
            "{table}"
        );
        let json = serde_json::to_value(&costs[0]).expect("serializable");
        assert_eq!(json, serde_json::json!({"name": "poll", "self": 30, "total": 30}));
    }

    #[test]
    fn ties_on_self_go_to_total_then_name() {
        use FrameKind::User;
        let profile = profile(vec![
            (stack(&[("b", User)]), 1),
            (stack(&[("a", User)]), 1),
            (stack(&[("c", User), ("a", User)]), 1),
        ]);
        let names: Vec<String> = top(&profile, 10).into_iter().map(|c| c.name).collect();
        // a: self 1, total 2; b and c: self 1, total 1, by name.
        assert_eq!(names, ["a", "b", "c"]);
        assert!(top(&profile, 0).is_empty());
        assert_eq!(top(&profile, 1).len(), 1);
    }

    #[test]
    fn the_table_shows_percentages_of_all_samples() {
        use FrameKind::User;
        let profile = profile(vec![
            (stack(&[("hot", User), ("main", User)]), 3),
            (stack(&[("main", User)]), 1),
        ]);
        let table = table(&profile, &top(&profile, 10));
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("# 4 samples"), "{table}");
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["75.00%", "75.00%", "3", "3", "hot"],
            "{table}"
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["25.00%", "100.00%", "1", "4", "main"],
            "{table}"
        );
    }

    #[test]
    fn control_characters_in_names_cannot_forge_table_rows() {
        let profile = profile(vec![(stack(&[("f\n 100.00% fake\x1b[2J", FrameKind::User)]), 1)]);
        let table = table(&profile, &top(&profile, 10));
        assert_eq!(table.lines().count(), 3, "{table}");
        assert!(table.ends_with("f\\n 100.00% fake\\u{1b}[2J\n"), "{table}");
    }

    #[test]
    fn json_names_follow_the_documented_schema() {
        let cost = FunctionCost {
            name: "f".into(),
            self_value: 1,
            total_value: 2,
            self_cpu_ns: Some(3),
            total_cpu_ns: Some(4),
        };
        let json = serde_json::to_value(&cost).expect("serializable");
        assert_eq!(
            json,
            serde_json::json!({"name": "f", "self": 1, "total": 2, "self_cpu_ns": 3, "total_cpu_ns": 4})
        );
    }
}
