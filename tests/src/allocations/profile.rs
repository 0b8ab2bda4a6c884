//! The daemon's heap profiles as `go tool pprof -raw` reads them, and the
//! shares of sites in them.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{HEAP_SAMPLE_TYPES, NO_SITE, SITES};
use crate::daemon::{RawSample, go_pprof, parse_raw};

/// Each of `values`' share of their sum, in percent (0 for an empty sum).
pub fn shares(values: &[f64]) -> Vec<f64> {
    let total: f64 = values.iter().sum();
    values
        .iter()
        .map(|value| if total > 0.0 { 100.0 * value / total } else { 0.0 })
        .collect()
}

/// Panics unless each of [`SITES`]' share in `got` is within `points`
/// percentage points of its share in `expected`; prints both either way.
pub fn assert_site_shares(what: &str, got: &[f64; 4], expected: &[f64; 4], points: f64) {
    assert_shares(what, &SITES, got, expected, points);
}

/// Panics unless each of `names`' share in `got` is within `points`
/// percentage points of its share in `expected` (both in the order of
/// `names`); prints both either way.
pub fn assert_shares(what: &str, names: &[&str], got: &[f64], expected: &[f64], points: f64) {
    assert_eq!(names.len(), got.len(), "{what}: a value per name");
    assert_eq!(names.len(), expected.len(), "{what}: an expected value per name");
    let got_shares = shares(got);
    let expected_shares = shares(expected);
    let mut table = String::new();
    for (index, site) in names.iter().enumerate() {
        table.push_str(&format!(
            "  {site:<20} got {:6.2} % ({:.0} bytes), expected {:6.2} % ({:.0} bytes)\n",
            got_shares[index], got[index], expected_shares[index], expected[index]
        ));
    }
    eprintln!("{what}:\n{table}");
    for (index, site) in names.iter().enumerate() {
        let off = (got_shares[index] - expected_shares[index]).abs();
        assert!(
            off <= points,
            "{what}: {site}'s share should be within {points} points of {:.2} %, got {:.2} % \
             ({off:.2} points off); all sites:\n{table}",
            expected_shares[index],
            got_shares[index]
        );
    }
}

/// The `site_*` function a stack (leaf first) allocates from: its first
/// frame of that name (a compiler's clone suffix, `.isra.0` and such,
/// dropped).
pub fn site_of(functions: &[String]) -> Option<&str> {
    functions
        .iter()
        .find(|function| function.starts_with("site_"))
        .map(|function| function.split('.').next().unwrap_or(function))
}

/// A heap profile as `go tool pprof -raw` prints it.
#[derive(Clone, Debug)]
pub struct AllocProfile {
    /// Where it was saved.
    pub file: PathBuf,
    /// "TYPE UNIT", as `PeriodType:` says ("" without one).
    pub period_type: String,
    pub period: i64,
    /// "type/unit", in the order of each sample's values.
    pub sample_types: Vec<String>,
    pub samples: Vec<RawSample>,
}

impl AllocProfile {
    /// Reads `file` (a gzipped profile) with `go tool pprof -raw`: the
    /// header by this, the samples (any number of values each) by
    /// [`parse_raw`].
    pub fn read(file: &Path) -> Self {
        Self::parse(file, &go_pprof(&["-raw", &file.display().to_string()]))
    }

    /// Parses `raw`, what `go tool pprof -raw` printed of `file`.
    pub fn parse(file: &Path, raw: &str) -> Self {
        let mut period_type = String::new();
        let mut period = 0;
        let mut sample_types = Vec::new();
        let mut lines = raw.lines();
        while let Some(line) = lines.next() {
            if let Some(value) = line.strip_prefix("PeriodType: ") {
                period_type = value.trim().to_owned();
            } else if let Some(value) = line.strip_prefix("Period: ") {
                period = value
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{}: a bad period line {line:?}", file.display()));
            } else if line == "Samples:" {
                // The next line names the sample types; "[dflt]" marks the
                // default one.
                sample_types = lines
                    .next()
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(|name| name.trim_end_matches("[dflt]").to_owned())
                    .collect();
                break;
            }
        }
        let samples = parse_raw(raw);
        for sample in &samples {
            assert_eq!(
                sample.values.len(),
                sample_types.len(),
                "{}: a sample has {} values for the {} sample types {sample_types:?}: {sample:?}",
                file.display(),
                sample.values.len(),
                sample_types.len()
            );
        }
        Self {
            file: file.to_owned(),
            period_type,
            period,
            sample_types,
            samples,
        }
    }

    /// Panics unless the sample types are Go's heap profile's, in its order.
    pub fn assert_heap_sample_types(&self) {
        assert_eq!(
            self.sample_types,
            HEAP_SAMPLE_TYPES,
            "{}: the sample types should be Go's heap profile's",
            self.file.display()
        );
        assert_eq!(
            self.period_type,
            "space bytes",
            "{}: the period type should be space/bytes, as Go's heap profile's",
            self.file.display()
        );
    }

    fn index(&self, sample_type: &str) -> usize {
        self.sample_types
            .iter()
            .position(|name| name == sample_type)
            .unwrap_or_else(|| {
                panic!(
                    "{}: no sample type {sample_type} among {:?}",
                    self.file.display(),
                    self.sample_types
                )
            })
    }

    /// One sample's value of `sample_type`.
    pub fn value(&self, sample: &RawSample, sample_type: &str) -> i64 {
        sample.values[self.index(sample_type)]
    }

    /// The sum of `sample_type` over the samples that satisfy `keep`.
    pub fn sum(&self, sample_type: &str, keep: impl Fn(&RawSample) -> bool) -> i64 {
        let index = self.index(sample_type);
        self.samples
            .iter()
            .filter(|sample| keep(sample))
            .map(|sample| sample.values[index])
            .sum()
    }

    /// `sample_type` summed per site ([`site_of`] each sample's stack;
    /// [`NO_SITE`] for stacks without one).
    pub fn by_site(&self, sample_type: &str) -> BTreeMap<String, i64> {
        let index = self.index(sample_type);
        let mut sums = BTreeMap::new();
        for sample in &self.samples {
            let site = site_of(&sample.functions).unwrap_or(NO_SITE);
            *sums.entry(site.to_owned()).or_insert(0) += sample.values[index];
        }
        sums
    }

    /// [`Self::by_site`] for [`SITES`], as floats in their order.
    pub fn sites(&self, sample_type: &str) -> [f64; 4] {
        let sums = self.by_site(sample_type);
        SITES.map(|site| sums.get(site).copied().unwrap_or(0) as f64)
    }

    /// `sample_type` at one site.
    pub fn at_site(&self, sample_type: &str, site: &str) -> i64 {
        self.by_site(sample_type).get(site).copied().unwrap_or(0)
    }

    /// `sample_type` summed over the samples whose stack holds `function`
    /// (see [`is_function`]).
    pub fn under(&self, sample_type: &str, function: &str) -> i64 {
        self.sum(sample_type, |sample| {
            sample.functions.iter().any(|frame| is_function(frame, function))
        })
    }
}

/// Whether a frame's name is `function`: exactly, or as a Rust path's last
/// segment (`crate::function`), or with a compiler's clone suffix
/// (`function.isra.0`).
pub fn is_function(frame: &str, function: &str) -> bool {
    let frame = frame.split('.').next().unwrap_or(frame);
    frame == function || frame.ends_with(&format!("::{function}"))
}

/// The numeric label `bytes` of a sample (`go tool pprof -raw` prints it
/// as `bytes:[N]`, or `bytes:[N bytes]` with a unit).
pub fn bytes_label(sample: &RawSample) -> Option<i64> {
    let text = sample.labels.get("bytes")?;
    let digits: String = text.trim().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocations::{ALLOC_OBJECTS, ALLOC_SPACE, INUSE_SPACE, LEAK_SITE};

    /// What `go tool pprof -raw` prints of a heap profile written by Go's
    /// runtime/pprof (trimmed).
    const GO_HEAP_RAW: &str = "PeriodType: space bytes
Period: 524288
Time: 2026-11-26 08:53:55.411513129 +0000 UTC
Samples:
alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes
          1     840284          1     840284: 1 2 3 
                bytes:[540672]
      19729  323241258      19729  323241258: 4 2 3 
                bytes:[16384]
       4096     524352          0          0: 5 2 3 
                bytes:[128 bytes]
Locations
     1: 0x4d96de M=1 site_leak /tmp/a.c:12:0 s=12
     2: 0x4d97b0 M=1 main /tmp/a.c:17:0 s=14
     3: 0x44cd14 M=1 __libc_start_call_main /x/libc.c:290:0 s=149
     4: 0x4d96a8 M=1 site_malloc_big.isra.0 /tmp/a.c:12:0 s=12
     5: 0x47c32b M=1 operator new /x/new.cc:1143:0 s=1067
Mappings
1: 0x400000/0x4da000/0x0 /tmp/a d58cec865b2618851ce1efafdbd18998e75d8dbc [FN]
";

    #[test]
    fn parses_a_go_heap_profile() {
        let profile = AllocProfile::parse(Path::new("heap.pb.gz"), GO_HEAP_RAW);
        profile.assert_heap_sample_types();
        assert_eq!(profile.period, 524_288);
        assert_eq!(profile.samples.len(), 3);
        assert_eq!(
            profile.samples.iter().map(bytes_label).collect::<Vec<_>>(),
            [Some(540_672), Some(16384), Some(128)]
        );
        let by_site = profile.by_site(INUSE_SPACE);
        assert_eq!(by_site.get(LEAK_SITE), Some(&840_284));
        assert_eq!(by_site.get("site_malloc_big"), Some(&323_241_258));
        assert_eq!(profile.by_site(ALLOC_OBJECTS).get(NO_SITE), Some(&4096));
        assert_eq!(
            profile.sum(ALLOC_SPACE, |_| true),
            840_284 + 323_241_258 + 524_352
        );
        // Go's own rounding: 524352 is 4096 x 128 and a bit.
        // Not `assert_space_is_objects_times_size`: Go labels a sample with its
        // block size and scales and rounds objects and space apart, while
        // profilerd labels the average of its scaled values.
    }
}
