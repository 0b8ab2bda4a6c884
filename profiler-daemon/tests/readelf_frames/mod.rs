//! The oracle for unwind tables: binutils' own reading of a file's CFI,
//! `readelf --debug-dump=frames-interp` (the table of rules per pc), parsed,
//! and compared with the worker's table pc by pc.

use std::{path::Path, process::Command};

use profiler_common::{CfaRule, RbpRule, UnwindRow};

/// One row as readelf prints it: the rule columns by register name.
#[derive(Clone, Debug)]
pub struct Row {
    pub loc: u64,
    /// e.g. `rsp+8`, `rbp+16`, `exp`.
    pub cfa: String,
    /// e.g. `c-16`, `u`; None when readelf prints no rbp column.
    pub rbp: Option<String>,
    /// e.g. `c-8`, `u` (undefined: the outermost frame).
    pub ra: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Fde {
    pub start: u64,
    pub end: u64,
    /// The CIE's augmentation has "S" (a signal trampoline).
    pub signal: bool,
    /// From `start`; the CIE's initial row when the FDE changes nothing.
    pub rows: Vec<Row>,
    /// Which section readelf found it in (".eh_frame" or ".debug_frame").
    pub section: String,
}

impl Fde {
    /// The row in force at `pc` (which the FDE covers).
    pub fn row_at(&self, pc: u64) -> &Row {
        let index = self.rows.partition_point(|row| row.loc <= pc);
        &self.rows[index.saturating_sub(1)]
    }
}

/// Every FDE readelf finds in `path`, in file order.
pub fn frames(path: &Path) -> Vec<Fde> {
    let output = Command::new("readelf")
        // Not the debug file a debug link names: only this file's CFI.
        .args(["--debug-dump=no-follow-links", "--debug-dump=frames-interp"])
        .arg(path)
        .output()
        .expect("running readelf (binutils)");
    assert!(output.status.success(), "readelf failed on {}", path.display());
    parse(&String::from_utf8_lossy(&output.stdout))
}

struct Cie {
    offset: String,
    signal: bool,
    initial: Option<Row>,
}

fn parse(text: &str) -> Vec<Fde> {
    let mut cies: Vec<Cie> = Vec::new();
    let mut fdes: Vec<Fde> = Vec::new();
    // Where rows go: the last CIE (its initial row) or the last FDE.
    let mut in_fde = false;
    let mut columns: Vec<String> = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Contents of the ") {
            section = rest.split_whitespace().next().unwrap_or_default().to_owned();
            continue;
        }
        // A register rule prints as "r10 (r10)": one value, two words.
        let mut words: Vec<&str> = Vec::new();
        for word in line.split_whitespace() {
            if !word.starts_with('(') || words.is_empty() {
                words.push(word);
            }
        }
        match words.as_slice() {
            [offset, _, _, "CIE", augmentation, ..] => {
                cies.push(Cie {
                    offset: (*offset).to_owned(),
                    signal: augmentation.trim_matches('"').contains('S'),
                    initial: None,
                });
                in_fde = false;
            }
            [_, _, _, "FDE", cie, range, ..] => {
                let cie = cie.trim_start_matches("cie=");
                let (start, end) = range
                    .trim_start_matches("pc=")
                    .split_once("..")
                    .expect("an FDE's pc range");
                let cie = cies
                    .iter()
                    .rev()
                    .find(|known| known.offset == cie)
                    .unwrap_or_else(|| panic!("readelf printed an FDE of unknown CIE {cie}"));
                fdes.push(Fde {
                    start: hex(start),
                    end: hex(end),
                    signal: cie.signal,
                    rows: cie.initial.iter().cloned().collect(),
                    section: section.clone(),
                });
                in_fde = true;
            }
            ["LOC", "CFA", names @ ..] => {
                columns = names.iter().map(|name| (*name).to_owned()).collect();
                if in_fde && let Some(fde) = fdes.last_mut() {
                    // The FDE prints its own rows, the first at its start.
                    fde.rows.clear();
                }
            }
            [loc, cfa, values @ ..] if loc.len() == 16 && loc.chars().all(|c| c.is_ascii_hexdigit()) => {
                let column = |name: &str| {
                    columns
                        .iter()
                        .position(|column| column == name)
                        .and_then(|index| values.get(index))
                        .map(|value| (*value).to_owned())
                };
                let row = Row {
                    loc: hex(loc),
                    cfa: (*cfa).to_owned(),
                    rbp: column("rbp"),
                    ra: column("ra"),
                };
                if in_fde {
                    if let Some(fde) = fdes.last_mut() {
                        fde.rows.push(row);
                    }
                } else if let Some(cie) = cies.last_mut() {
                    cie.initial = Some(row);
                }
            }
            _ => {}
        }
    }
    for fde in &mut fdes {
        if let Some(first) = fde.rows.first_mut() {
            first.loc = fde.start;
        }
    }
    fdes
}

fn hex(text: &str) -> u64 {
    u64::from_str_radix(text, 16).unwrap_or_else(|_| panic!("{text:?} is not hexadecimal"))
}

/// The address ranges of the named sections (e.g. ".plt", ".plt.sec").
pub fn section_ranges(path: &Path, names: &[&str]) -> Vec<std::ops::Range<u64>> {
    let output = Command::new("readelf")
        .arg("--section-headers")
        .arg("--wide")
        .arg(path)
        .output()
        .expect("running readelf (binutils)");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .filter_map(|line| {
            // "  [14] .plt  PROGBITS  0000000000026000 026000 000360 10 AX 0 0 16"
            let words: Vec<&str> = line.split(']').nth(1)?.split_whitespace().collect();
            let (name, address, size) = (words.first()?, words.get(2)?, words.get(4)?);
            names.contains(name).then(|| {
                let start = hex(address);
                start..start + hex(size)
            })
        })
        .collect()
}

/// The ELF entry point (`_start`).
pub fn entry_point(path: &Path) -> u64 {
    use std::io::Read as _;
    let mut header = [0u8; 32];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut header))
        .expect("reading the ELF header");
    u64::from_le_bytes(header[24..32].try_into().expect("8 bytes"))
}

/// Our row for `pc` (NoInfo before the first row).
pub fn row_at(rows: &[UnwindRow], pc: u64) -> UnwindRow {
    let index = rows.partition_point(|row| u64::from(row.pc) <= pc);
    index
        .checked_sub(1)
        .map_or(UnwindRow::default(), |index| rows[index])
}

/// What readelf's row says our row must be; None when it matches.
fn disagreement(
    fde: Option<&Fde>,
    pc: u64,
    ours: &UnwindRow,
    plt: &[std::ops::Range<u64>],
) -> Option<String> {
    let rule = ours.cfa_rule();
    let Some(fde) = fde else {
        return (rule != CfaRule::NoInfo as u8).then(|| "no FDE covers it but the row is not NoInfo".into());
    };
    let theirs = fde.row_at(pc);
    let wrong = |what: &str| Some(format!("{what}; readelf: {theirs:?}"));
    if fde.signal {
        return (rule != CfaRule::Signal as u8).then(|| "a signal frame's row is not Signal".into());
    }
    match theirs.ra.as_deref() {
        Some("u") => {
            return (rule != CfaRule::End as u8).then(|| "an undefined return address is not End".into());
        }
        Some("c-8") | None => {}
        Some(_) => {
            return (rule != CfaRule::Unsupported as u8)
                .then(|| "a moved return address is supported".into());
        }
    }
    let register = |name: &str| {
        let offset: i64 = theirs.cfa.strip_prefix(name)?.strip_prefix('+')?.parse().ok()?;
        Some(
            (offset >= 0 && offset % 8 == 0 && offset / 8 <= i64::from(u16::MAX))
                .then_some((offset / 8) as u16),
        )
    };
    let expected_cfa = match (register("rsp"), register("rbp")) {
        (Some(Some(offset)), _) => (CfaRule::Rsp, offset),
        (_, Some(Some(offset))) => (CfaRule::Rbp, offset),
        (Some(None), _) | (_, Some(None)) => (CfaRule::Unsupported, 0),
        (None, None) if theirs.cfa == "exp" && plt.iter().any(|range| range.contains(&pc)) => {
            (CfaRule::Plt, 0)
        }
        (None, None) if theirs.cfa == "exp" => {
            // A realignment (DerefRsp) or another expression; which one the
            // unit tests check from the bytes. Never a register rule.
            if rule != CfaRule::DerefRsp as u8 && rule != CfaRule::Unsupported as u8 {
                return wrong("an expression became a register rule");
            }
            return None;
        }
        (None, None) => (CfaRule::Unsupported, 0),
    };
    if expected_cfa.0 == CfaRule::Unsupported {
        return (rule != CfaRule::Unsupported as u8)
            .then(|| format!("CFA {} should be unsupported", theirs.cfa));
    }
    if rule != expected_cfa.0 as u8 || (expected_cfa.0 != CfaRule::Plt && ours.cfa_offset != expected_cfa.1) {
        return wrong(&format!("CFA should be {:?} {}", expected_cfa.0, expected_cfa.1));
    }
    let expected_rbp = match theirs.rbp.as_deref() {
        None | Some("u") | Some("s") => (RbpRule::Unchanged, 0),
        Some(saved) => match saved
            .strip_prefix('c')
            .and_then(|offset| offset.parse::<i64>().ok())
        {
            Some(offset) if offset % 8 == 0 && i8::try_from(offset / 8).is_ok() => {
                (RbpRule::Offset, (offset / 8) as i8)
            }
            _ => (RbpRule::Unsupported, 0),
        },
    };
    if ours.rbp_rule() != expected_rbp.0 as u8
        || (expected_rbp.0 == RbpRule::Offset && ours.rbp_offset != expected_rbp.1)
    {
        return wrong(&format!("rbp should be {:?} {}", expected_rbp.0, expected_rbp.1));
    }
    None
}

/// Compares our table (`rows`) of `path` with readelf's reading at every row
/// boundary readelf prints, the byte before it, and `spread` pcs spread over
/// the covered range. Returns how many pcs had each of our CFA rules.
pub fn compare(path: &Path, rows: &[UnwindRow], spread: u64) -> [usize; 8] {
    let mut fdes = frames(path);
    assert!(!fdes.is_empty(), "readelf found no FDE in {}", path.display());
    fdes.retain(|fde| fde.end > fde.start);
    fdes.sort_by_key(|fde| fde.start);
    let plt = section_ranges(path, &[".plt", ".plt.sec"]);
    let first = fdes.first().map_or(0, |fde| fde.start);
    let last = fdes.iter().map(|fde| fde.end).max().unwrap_or(0);
    let mut pcs: Vec<u64> = fdes
        .iter()
        .flat_map(|fde| {
            fde.rows
                .iter()
                .flat_map(|row| [row.loc, row.loc.saturating_sub(1)])
        })
        .collect();
    pcs.extend((0..spread).map(|index| first + (last - first) * index / spread + index % 7));
    pcs.push(last);
    let mut seen = [0usize; 8];
    let mut failures = Vec::new();
    for &pc in &pcs {
        let covering = fdes.partition_point(|fde| fde.start <= pc);
        let fde = covering
            .checked_sub(1)
            .map(|index| &fdes[index])
            .filter(|fde| pc < fde.end);
        let ours = row_at(rows, pc);
        seen[usize::from(ours.cfa_rule()).min(7)] += 1;
        if let Some(why) = disagreement(fde, pc, &ours, &plt) {
            failures.push(format!("pc {pc:#x}: {why}; ours: {ours:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} pcs of {} disagree with readelf, e.g.:\n{}",
        failures.len(),
        pcs.len(),
        path.display(),
        failures[..failures.len().min(12)].join("\n")
    );
    eprintln!(
        "{}: {} pcs agree with readelf; by CFA rule {seen:?}",
        path.display(),
        pcs.len()
    );
    seen
}
