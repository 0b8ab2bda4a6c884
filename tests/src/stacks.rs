//! User stacks from any source (profilerd's /folded, `perf script`) in one
//! form, and the measures the unwinding tests compare: the share of samples
//! whose stack holds a chain of functions, and functions by inclusive share.
//! Both sources go through the same code, so they are measured identically.

use std::collections::HashMap;

use crate::FoldedLine;

/// One user stack and how many samples had it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    /// Function names, root first: physical frames only (no inlined frames,
    /// no kernel frames), names as the source printed them.
    pub frames: Vec<String>,
    pub count: u64,
}

impl Stack {
    pub fn leaf(&self) -> Option<&str> {
        self.frames.last().map(String::as_str)
    }

    /// Whether `chain` (root first) appears in this stack in that order, not
    /// necessarily adjacent (frames the chain does not name may sit between).
    pub fn has_chain(&self, chain: &[&str]) -> bool {
        let mut frames = self.frames.iter();
        chain.iter().all(|wanted| frames.any(|frame| frame == wanted))
    }
}

/// The stacks of one process (or of any set of samples).
#[derive(Clone, Debug, Default)]
pub struct Stacks(pub Vec<Stack>);

impl Stacks {
    /// profilerd's folded lines: inlined (`_[i]`) and kernel (`_[k]`) frames
    /// dropped, which is what `perf script --no-inline` of user frames gives.
    pub fn from_folded(lines: &[FoldedLine]) -> Self {
        Self(
            lines
                .iter()
                .map(|line| Stack {
                    frames: line
                        .frames
                        .iter()
                        .filter(|frame| !frame.ends_with("_[i]") && !frame.ends_with("_[k]"))
                        .cloned()
                        .collect(),
                    count: line.count,
                })
                .collect(),
        )
        .merged()
    }

    pub fn total(&self) -> u64 {
        self.0.iter().map(|stack| stack.count).sum()
    }

    /// Samples whose stack satisfies `keep`.
    pub fn count(&self, keep: impl Fn(&Stack) -> bool) -> u64 {
        self.0
            .iter()
            .filter(|stack| keep(stack))
            .map(|stack| stack.count)
            .sum()
    }

    /// Only the stacks that satisfy `keep`.
    pub fn filter(&self, keep: impl Fn(&Stack) -> bool) -> Self {
        Self(self.0.iter().filter(|stack| keep(stack)).cloned().collect())
    }

    /// Percentage of all samples whose stack satisfies `keep` (0 if none).
    pub fn share(&self, keep: impl Fn(&Stack) -> bool) -> f64 {
        percent(self.count(keep), self.total())
    }

    /// Percentage of samples whose stack reaches `main`.
    pub fn reaching_main(&self) -> f64 {
        self.share(|stack| stack.frames.iter().any(|frame| frame == "main"))
    }

    /// Functions by inclusive share (percent of samples whose stack holds
    /// them, counted once per sample however often they recur), highest
    /// first, under their [`canonical`] names.
    pub fn inclusive(&self) -> Vec<(String, f64)> {
        let mut counts: HashMap<String, u64> = HashMap::new();
        for stack in &self.0 {
            let mut names: Vec<String> = stack.frames.iter().map(|f| canonical(f)).collect();
            names.sort();
            names.dedup();
            for name in names {
                *counts.entry(name).or_default() += stack.count;
            }
        }
        let total = self.total();
        let mut shares: Vec<(String, f64)> = counts
            .into_iter()
            .map(|(name, count)| (name, percent(count, total)))
            .collect();
        shares.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        shares
    }

    /// The `limit` most frequent stacks that fail `keep`, one per line
    /// (`root;...;leaf COUNT`), for a failure message. Stacks that differ
    /// only in the addresses of unknown frames are shown as one.
    pub fn offending(&self, keep: impl Fn(&Stack) -> bool, limit: usize) -> String {
        let shown = Self(
            self.0
                .iter()
                .filter(|stack| !keep(stack))
                .map(|stack| Stack {
                    frames: stack
                        .frames
                        .iter()
                        .map(|frame| unknown_without_address(frame))
                        .collect(),
                    count: stack.count,
                })
                .collect(),
        )
        .merged();
        let mut bad = shown.0;
        bad.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
        let mut text: String = bad
            .iter()
            .take(limit)
            .map(|stack| format!("  {} {}\n", abridged(&stack.frames), stack.count))
            .collect();
        if bad.len() > limit {
            text.push_str(&format!("  ... and {} more stacks\n", bad.len() - limit));
        }
        if text.is_empty() {
            text.push_str("  (none)\n");
        }
        text
    }

    /// Merges stacks with the same frames (perf gives one per sample).
    pub fn merged(&self) -> Self {
        let mut counts: HashMap<&[String], u64> = HashMap::new();
        for stack in &self.0 {
            *counts.entry(&stack.frames).or_default() += stack.count;
        }
        Self(
            counts
                .into_iter()
                .map(|(frames, count)| Stack {
                    frames: frames.to_vec(),
                    count,
                })
                .collect(),
        )
    }
}

/// `[unknown] 0x7f..` -> `[unknown]`, `[unknown] libx.so+0x10` ->
/// `[unknown] libx.so`: what is unknown, without where.
fn unknown_without_address(frame: &str) -> String {
    match frame.strip_prefix("[unknown]") {
        Some(rest) => {
            let rest = rest.trim();
            match rest.rsplit_once("+0x") {
                Some((file, _)) => format!("[unknown] {file}"),
                None => "[unknown]".to_owned(),
            }
        }
        None => frame.to_owned(),
    }
}

/// A stack for a message: its root end and its leaf end if it is deep.
fn abridged(frames: &[String]) -> String {
    const ROOT: usize = 4;
    const LEAF: usize = 10;
    if frames.len() <= ROOT + LEAF + 1 {
        return frames.join(";");
    }
    format!(
        "{};...{} frames...;{}",
        frames[..ROOT].join(";"),
        frames.len() - ROOT - LEAF,
        frames[frames.len() - LEAF..].join(";")
    )
}

pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// A function name both perf and profilerd agree on. perf names a function
/// by its ELF symbol, demangled (`std::__introsort_loop<...>`,
/// `__libc_start_main@@GLIBC_2.34`, `f [clone .constprop.0]`); profilerd by
/// its DWARF name where there is debug info (`__introsort_loop<..., long
/// int, ...>`, without the namespace). What both keep is the last path
/// component without template arguments, parameters, symbol version or
/// compiler clone suffix, and without leading underscores: `introsort_loop`,
/// `libc_start_main`, `f`.
pub fn canonical(name: &str) -> String {
    if name.starts_with("[unknown]") {
        return "[unknown]".to_owned();
    }
    let name = name.split(" [clone").next().unwrap_or(name);
    let name = name.split('@').next().unwrap_or(name);
    // Template arguments and parameters, however nested; `{{closure}}` and
    // `{closure#0}` are the same closure.
    let mut plain = String::new();
    let mut depth = 0usize;
    for c in name.chars() {
        match c {
            '<' | '(' => depth += 1,
            '>' | ')' if depth > 0 => depth -= 1,
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let plain = plain.replace("{{closure}}", "{closure}");
    let last = plain
        .rsplit("::")
        .find(|part| !part.trim().is_empty())
        .unwrap_or(&plain)
        .trim();
    let last = last.split_once("{closure#").map_or(last, |(head, _)| head);
    let last = if last.is_empty() { "{closure}" } else { last };
    // A return type before the name (`void f`), then GCC's clone suffixes.
    let last = last.rsplit(' ').next().unwrap_or(last);
    let mut base = last.to_owned();
    for suffix in [".constprop", ".isra", ".part", ".cold", ".lto_priv"] {
        if let Some(at) = base.find(suffix) {
            base.truncate(at);
        }
    }
    // glibc's internal aliases: the debug info names `__GI___clock_gettime`
    // what the symbol table calls `__clock_gettime`, and the memcpy
    // variants are aliases of the memmove ones at the same address (either
    // name may be picked); the symbol table's `__libc_start_main` is the
    // debug info's `__libc_start_main_impl`; malloc's sbrk path is the
    // debug info's `__glibc_morecore` and the symbol table's
    // `__default_morecore`, one address.
    let base = base.trim_start_matches('_');
    let base = base.strip_prefix("GI_").unwrap_or(base).trim_start_matches('_');
    let base = base.strip_suffix("_impl").unwrap_or(base);
    match base.strip_prefix("memcpy_") {
        Some(variant) => format!("memmove_{variant}"),
        None if base == "glibc_morecore" => "default_morecore".to_owned(),
        None => base.to_owned(),
    }
}

/// Where two inclusive rankings disagree by more than `points` percentage
/// points, over the `top` first functions of either: (function, share in
/// `a`, share in `b`). Functions absent from one side count as 0 there.
pub fn disagreements(
    a: &[(String, f64)],
    b: &[(String, f64)],
    top: usize,
    points: f64,
) -> Vec<(String, f64, f64)> {
    let share = |list: &[(String, f64)], name: &str| {
        list.iter()
            .find(|(other, _)| other == name)
            .map_or(0.0, |(_, share)| *share)
    };
    let mut names: Vec<&str> = a
        .iter()
        .take(top)
        .chain(b.iter().take(top))
        .map(|(name, _)| name.as_str())
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| (name.to_owned(), share(a, name), share(b, name)))
        .filter(|(_, x, y)| (x - y).abs() > points)
        .collect()
}

/// Two rankings side by side, for a message: `share_a share_b name`.
pub fn side_by_side(a: &[(String, f64)], b: &[(String, f64)], top: usize) -> String {
    let mut names: Vec<&str> = a.iter().take(top).map(|(name, _)| name.as_str()).collect();
    for (name, _) in b.iter().take(top) {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    let share = |list: &[(String, f64)], name: &str| {
        list.iter()
            .find(|(other, _)| other == name)
            .map_or(0.0, |(_, share)| *share)
    };
    names
        .iter()
        .map(|name| format!("  {:6.2} {:6.2}  {name}\n", share(a, name), share(b, name)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_and_dwarf_names_meet() {
        for (perf, dwarf) in [
            (
                "std::__introsort_loop<__gnu_cxx::__normal_iterator<unsigned int*, std::vector<unsigned int, std::allocator<unsigned int> > >, long, __gnu_cxx::__ops::_Iter_comp_iter<level_three::{lambda(unsigned int, unsigned int)#1}> >",
                "__introsort_loop<__gnu_cxx::__normal_iterator<unsigned int*, std::vector<unsigned int> >, long int, __gnu_cxx::__ops::_Iter_comp_iter<level_three(std::vector<unsigned int>&, uint64_t)::<lambda(uint32_t, uint32_t)> > >",
            ),
            ("__libc_start_main@@GLIBC_2.34", "__libc_start_main"),
            (
                "void std::__insertion_sort<int*>(int*, int*) [clone .constprop.0]",
                "__insertion_sort<int*>",
            ),
            (
                "hashbrown::rustc_entry::<impl hashbrown::map::HashMap<K,V,S,A>>::rustc_entry",
                "<hashbrown::map::HashMap<u64, u32>>::rustc_entry",
            ),
            (
                "std::rt::lang_start::<()>::{closure#0}",
                "std::rt::lang_start::{{closure}}",
            ),
            ("[unknown]", "[unknown] 0xfc5fb100ffa865c"),
            ("f.cold", "f"),
            (
                "__memmove_avx512_unaligned_erms",
                "__memcpy_avx512_unaligned_erms",
            ),
            ("__clock_gettime", "__GI___clock_gettime"),
            ("__default_morecore@GLIBC_2.2.5", "__glibc_morecore"),
        ] {
            assert_eq!(canonical(perf), canonical(dwarf), "{perf} vs {dwarf}");
        }
        assert_eq!(canonical("main"), "main");
        assert_eq!(canonical("rust_nofp::rust_hot_path"), "rust_hot_path");
        assert_eq!(canonical("__libc_start_main@@GLIBC_2.34"), "libc_start_main");
    }

    #[test]
    fn chains_are_ordered_not_adjacent() {
        let stack = Stack {
            frames: ["_start", "main", "a", "x", "b", "c"].map(String::from).to_vec(),
            count: 1,
        };
        assert!(stack.has_chain(&["main", "a", "b", "c"]));
        assert!(!stack.has_chain(&["main", "b", "a"]));
        assert!(!stack.has_chain(&["main", "d"]));
    }

    #[test]
    fn inclusive_counts_a_function_once_per_sample() {
        let stacks = Stacks(vec![
            Stack {
                frames: ["main", "f", "f", "g"].map(String::from).to_vec(),
                count: 3,
            },
            Stack {
                frames: ["main", "h"].map(String::from).to_vec(),
                count: 1,
            },
        ]);
        let shares = stacks.inclusive();
        assert_eq!(shares[0], ("main".to_owned(), 100.0));
        assert!(shares.contains(&("f".to_owned(), 75.0)));
        assert!(shares.contains(&("h".to_owned(), 25.0)));
        let other = vec![("main".to_owned(), 100.0), ("f".to_owned(), 70.0)];
        let differ = disagreements(&shares, &other, 10, 3.0);
        let names: Vec<&str> = differ.iter().map(|(name, _, _)| name.as_str()).collect();
        assert_eq!(names, ["f", "g", "h"]);
    }
}
