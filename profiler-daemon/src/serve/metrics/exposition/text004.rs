//! OpenMetrics 1.0.0 text to the Prometheus text format 0.0.4.
//!
//! prometheus-client encodes OpenMetrics only. The two formats share sample
//! lines (names, label escaping, values) but differ in metadata:
//!
//! - A family's HELP and TYPE name the family (`foo`) in OpenMetrics but the
//!   samples in 0.0.4, so a counter's become `foo_total`'s and an info's
//!   `foo_info`'s; without that, 0.0.4 readers see a `foo_total` without help
//!   or type (`promtool check metrics`: "no help text").
//! - Types 0.0.4 lacks: `info` and `stateset` become gauges (their samples
//!   are 1/0 values), `unknown` becomes `untyped`, and `gaugehistogram` one
//!   gauge per sample name (`_bucket`, `_gsum`, `_gcount`), keeping the names.
//! - `# UNIT` and `# EOF` do not exist in 0.0.4; `_created` samples and
//!   exemplars have no place there; timestamps are milliseconds, not seconds.
//! - HELP escapes backslash, newline and the double quote in OpenMetrics, only
//!   the first two in 0.0.4 (where `\"` is an error).
//!
//! Input that is not OpenMetrics is refused rather than passed on half
//! converted: it would be a bug of ours, and a scraper is better told.

use std::{collections::HashSet, fmt::Write as _};

/// Why a text could not be converted (the first offending line, 1-based).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line} of the OpenMetrics text: {reason}")]
pub struct ConvertError {
    pub line: usize,
    pub reason: String,
}

/// The OpenMetrics metric types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    GaugeHistogram,
    StateSet,
    Info,
    Summary,
    Unknown,
}

impl Kind {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "counter" => Self::Counter,
            "gauge" => Self::Gauge,
            "histogram" => Self::Histogram,
            "gaugehistogram" => Self::GaugeHistogram,
            "stateset" => Self::StateSet,
            "info" => Self::Info,
            "summary" => Self::Summary,
            "unknown" => Self::Unknown,
            _ => return None,
        })
    }

    /// The suffixes its samples may add to the family name.
    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Self::Counter => &["_total", "_created"],
            Self::Gauge | Self::StateSet | Self::Unknown => &[""],
            Self::Info => &["_info"],
            Self::Histogram => &["_bucket", "_sum", "_count", "_created"],
            Self::GaugeHistogram => &["_bucket", "_gsum", "_gcount"],
            Self::Summary => &["", "_sum", "_count", "_created"],
        }
    }

    /// The 0.0.4 families it becomes: (suffix of their name, 0.0.4 type).
    fn families_004(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Counter => &[("_total", "counter")],
            Self::Gauge | Self::StateSet => &[("", "gauge")],
            Self::Info => &[("_info", "gauge")],
            Self::Unknown => &[("", "untyped")],
            Self::Histogram => &[("", "histogram")],
            Self::Summary => &[("", "summary")],
            Self::GaugeHistogram => &[("_bucket", "gauge"), ("_gsum", "gauge"), ("_gcount", "gauge")],
        }
    }
}

/// One OpenMetrics metric family as read so far.
struct Family<'a> {
    name: &'a str,
    kind: Kind,
    /// Unescaped.
    help: Option<String>,
    /// Has `# TYPE` been read?
    typed: bool,
    /// The 0.0.4 lines of its samples, with their sample names.
    samples: Vec<(&'a str, String)>,
}

impl<'a> Family<'a> {
    fn new(name: &'a str) -> Self {
        Self {
            name,
            kind: Kind::Unknown,
            help: None,
            typed: false,
            samples: Vec::new(),
        }
    }

    /// Does a sample of this name belong here?
    fn owns(&self, sample: &str) -> bool {
        sample
            .strip_prefix(self.name)
            .is_some_and(|suffix| self.kind.suffixes().contains(&suffix))
    }

    /// Is it the `_created` sample of a counter, histogram or summary?
    fn is_created(&self, sample: &str) -> bool {
        self.kind.suffixes().contains(&"_created") && sample.strip_prefix(self.name) == Some("_created")
    }
}

/// Converts a whole OpenMetrics exposition (ending in `# EOF`).
pub fn to_text_004(open_metrics: &str) -> Result<String, ConvertError> {
    let mut converter = Converter {
        out: String::with_capacity(open_metrics.len()),
        written: HashSet::new(),
        family: None,
    };
    let mut ended = false;
    for (index, line) in open_metrics.lines().enumerate() {
        let fail = |reason: &str| ConvertError {
            line: index + 1,
            reason: reason.to_owned(),
        };
        if ended {
            return Err(fail("text after # EOF"));
        }
        if line == "# EOF" {
            ended = true;
            continue;
        }
        if let Some(comment) = line.strip_prefix("# ") {
            let (keyword, rest) = comment.split_once(' ').ok_or_else(|| fail("bad comment"))?;
            let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
            check_name(name).map_err(fail)?;
            // Metadata of another name starts the next family.
            let current = converter.family_named(name).map_err(fail)?;
            match keyword {
                "HELP" if current.help.is_none() => current.help = Some(unescape_help(value)),
                "TYPE" if !current.typed && current.samples.is_empty() => {
                    current.kind = Kind::parse(value).ok_or_else(|| fail("unknown type"))?;
                    current.typed = true;
                }
                "UNIT" => {}
                "HELP" | "TYPE" => return Err(fail("repeated or late metadata")),
                _ => return Err(fail("unknown comment")),
            }
            continue;
        }
        let (sample, line_004) = sample_004(line).map_err(fail)?;
        let current = converter.family_of_sample(sample).map_err(fail)?;
        if !current.is_created(sample) {
            current.samples.push((sample, line_004));
        }
    }
    if !ended {
        return Err(ConvertError {
            line: open_metrics.lines().count(),
            reason: "no # EOF: the text is cut short".to_owned(),
        });
    }
    converter.finish_family().map_err(|reason| ConvertError {
        line: open_metrics.lines().count(),
        reason: reason.to_owned(),
    })?;
    Ok(converter.out)
}

struct Converter<'a> {
    out: String,
    /// The 0.0.4 families written: one of them twice would be refused by a
    /// 0.0.4 reader ("second HELP line").
    written: HashSet<String>,
    family: Option<Family<'a>>,
}

impl<'a> Converter<'a> {
    /// The family metadata of `name` belongs to, the next one if the current
    /// family has another name.
    fn family_named(&mut self, name: &'a str) -> Result<&mut Family<'a>, &'static str> {
        if self.family.as_ref().is_none_or(|family| family.name != name) {
            self.finish_family()?;
        }
        Ok(self.family.get_or_insert_with(|| Family::new(name)))
    }

    /// The family a sample belongs to: the current one if its name fits,
    /// else one of its own, of unknown type (a sample without metadata).
    fn family_of_sample(&mut self, sample: &'a str) -> Result<&mut Family<'a>, &'static str> {
        if self.family.as_ref().is_none_or(|family| !family.owns(sample)) {
            self.finish_family()?;
        }
        Ok(self.family.get_or_insert_with(|| Family::new(sample)))
    }

    fn finish_family(&mut self) -> Result<(), &'static str> {
        let Some(family) = self.family.take() else {
            return Ok(());
        };
        for (suffix, type_004) in family.kind.families_004() {
            let name = format!("{}{suffix}", family.name);
            let out = &mut self.out;
            if let Some(help) = &family.help {
                let _ = writeln!(out, "# HELP {name} {}", escape_help_004(help));
            }
            let _ = writeln!(out, "# TYPE {name} {type_004}");
            // Histograms and summaries keep all their samples in one family;
            // a gauge histogram's are grouped by sample name.
            let grouped = family.kind == Kind::GaugeHistogram;
            for (sample, line) in &family.samples {
                if !grouped || *sample == name {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            if !self.written.insert(name) {
                return Err("a metric family seen twice (or two of one name in 0.0.4)");
            }
        }
        Ok(())
    }
}

/// A sample line in 0.0.4, and its sample name: name and labels as they are
/// (the label escapes are the same), the value, the timestamp in
/// milliseconds; the exemplar dropped.
fn sample_004(line: &str) -> Result<(&str, String), &'static str> {
    let name_end = line.find(['{', ' ']).ok_or("a sample without a value")?;
    let name = &line[..name_end];
    check_name(name)?;
    let labels_end = if line[name_end..].starts_with('{') {
        name_end + labels_len(&line[name_end..])?
    } else {
        name_end
    };
    let rest = line[labels_end..]
        .strip_prefix(' ')
        .ok_or("no space before the value")?;
    // The exemplar, if any, follows " # " (label values, where "#" may
    // appear, are behind us).
    let rest = rest.split_once(" # ").map_or(rest, |(before, _)| before);
    let mut fields = rest.split(' ');
    let value = fields.next().unwrap_or_default();
    value.parse::<f64>().map_err(|_| "a value that is not a number")?;
    let mut out = format!("{} {value}", &line[..labels_end]);
    if let Some(seconds) = fields.next() {
        let seconds = seconds
            .parse::<f64>()
            .ok()
            .filter(|seconds| seconds.is_finite())
            .ok_or("a timestamp that is not a number")?;
        let _ = write!(out, " {}", (seconds * 1000.0).round() as i64);
    }
    if fields.next().is_some() {
        return Err("text after the timestamp");
    }
    Ok((name, out))
}

/// The length of the label set at the start of `text` (`{...}`, braces
/// included), reading quoted values with their escapes.
fn labels_len(text: &str) -> Result<usize, &'static str> {
    let mut in_value = false;
    let mut escaped = false;
    for (index, byte) in text.bytes().enumerate().skip(1) {
        match (in_value, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (_, false, b'"') => in_value = !in_value,
            (false, _, b'}') => return Ok(index + 1),
            _ => {}
        }
    }
    Err("an unterminated label set")
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, the names both formats accept unquoted.
fn check_name(name: &str) -> Result<(), &'static str> {
    let mut bytes = name.bytes();
    let valid = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':');
    if valid { Ok(()) } else { Err("not a metric name") }
}

/// OpenMetrics HELP text as it reads. A backslash before anything but `\`,
/// `"` or `n` is kept as it is: prometheus-client writes HELP unescaped.
fn unescape_help(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let unescaped = match (c, chars.peek()) {
            ('\\', Some('\\')) => '\\',
            ('\\', Some('"')) => '"',
            ('\\', Some('n')) => '\n',
            _ => {
                out.push(c);
                continue;
            }
        };
        chars.next();
        out.push(unescaped);
    }
    out
}

/// HELP text escaped for 0.0.4: backslash and newline only.
fn escape_help_004(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests;
