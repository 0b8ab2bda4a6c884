//! Which exposition format a request's `Accept` header asks for.
//!
//! The rule is Prometheus's own (client_golang's `expfmt.Negotiate`): the
//! OpenMetrics text only to a client that names it, since OpenMetrics-only
//! lines (`# EOF`, `# UNIT`, HELP under the family name) break readers of the
//! older text format such as `promtool check metrics`; the text format 0.0.4
//! to everyone else, wildcards and a missing header included.

/// The two texts `/metrics` can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0, what prometheus-client encodes.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Text004,
}

/// A media range of the header that names one of our formats.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    format: Format,
    /// The weight, 0 to 1000 (q=0.5 is 500), so that ties compare exactly.
    weight: u16,
    /// 2 for a full type, 1 for `text/*`, 0 for `*/*`: at equal weights the
    /// more specific range is the one the client meant.
    specificity: u8,
}

/// Negotiates from every `Accept` value of the request (a client may send the
/// header more than once; the values then form one list).
///
/// The best range by weight, then specificity, then order of appearance
/// decides; q=0 means "not acceptable". OpenMetrics is chosen only through an
/// explicit `application/openmetrics-text` (of version 1.0.0, or no version):
/// `*/*` and `application/*` get the text format 0.0.4, as do headers that
/// name neither (serving something beats a 406 to a scraper).
pub fn negotiate<'a>(accept_values: impl IntoIterator<Item = &'a str>) -> Format {
    let mut best: Option<Candidate> = None;
    for range in accept_values.into_iter().flat_map(|value| value.split(',')) {
        let Some(candidate) = candidate(range) else {
            continue;
        };
        if candidate.weight == 0 {
            continue;
        }
        // Strictly better only: at a full tie the earlier range stays.
        let better = best
            .is_none_or(|best| (candidate.weight, candidate.specificity) > (best.weight, best.specificity));
        if better {
            best = Some(candidate);
        }
    }
    best.map_or(Format::Text004, |best| best.format)
}

/// What one media range (`type/subtype;param=value;q=0.5`) says, if it names
/// a format we serve; `None` for other types, bad weights and versions we do
/// not serve.
fn candidate(range: &str) -> Option<Candidate> {
    let mut parts = range.split(';');
    let media_type = parts.next()?.trim().to_ascii_lowercase();
    let (kind, subtype) = media_type.split_once('/')?;
    let mut weight = 1000;
    let mut version = None;
    for param in parts {
        let Some((name, value)) = param.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"');
        match name.trim().to_ascii_lowercase().as_str() {
            "q" => weight = parse_weight(value)?,
            "version" => version = Some(value.to_owned()),
            // `charset`, `escaping` (Prometheus 3) and the like: our names and
            // label values are valid under every escaping scheme.
            _ => {}
        }
    }
    let (format, specificity) = match (kind, subtype) {
        ("application", "openmetrics-text") => {
            // 0.0.1 differs from 1.0.0 in details we do not produce; a client
            // that wants only it still gets a text it can read below.
            if version.as_deref().is_some_and(|version| version != "1.0.0") {
                return None;
            }
            (Format::OpenMetrics, 2)
        }
        ("text", "plain") => (Format::Text004, 2),
        ("text", "*") => (Format::Text004, 1),
        ("*", "*") => (Format::Text004, 0),
        _ => return None,
    };
    Some(Candidate {
        format,
        weight,
        specificity,
    })
}

/// A q-value (RFC 9110: `0`, `1`, or `0.` followed by up to three digits) as
/// thousandths; `None` if it is not one.
fn parse_weight(value: &str) -> Option<u16> {
    let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = format!("{fraction:0<3}").parse::<u16>().ok()?;
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(header: &str) -> Format {
        negotiate([header])
    }

    #[test]
    fn no_header_or_wildcards_get_the_text_format() {
        assert_eq!(negotiate([]), Format::Text004, "no Accept: 0.0.4");
        assert_eq!(of("*/*"), Format::Text004, "*/*: 0.0.4");
        assert_eq!(of("application/*"), Format::Text004, "application/*: 0.0.4");
        assert_eq!(of("text/plain"), Format::Text004, "text/plain: 0.0.4");
        assert_eq!(
            of("text/plain;version=0.0.4"),
            Format::Text004,
            "text/plain;version=0.0.4: 0.0.4"
        );
        assert_eq!(of("application/json"), Format::Text004, "unrelated: 0.0.4");
        assert_eq!(of(""), Format::Text004, "empty: 0.0.4");
    }

    #[test]
    fn prometheus_servers_get_openmetrics() {
        // Prometheus 2.x (recent), 2.42 and 3.x scrape headers.
        for header in [
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
        ] {
            assert_eq!(of(header), Format::OpenMetrics, "{header}: OpenMetrics");
        }
        assert_eq!(
            of("application/openmetrics-text"),
            Format::OpenMetrics,
            "no version: OpenMetrics"
        );
        assert_eq!(
            of(" Application/OpenMetrics-Text ; Version=\"1.0.0\" ; Q=1.000 "),
            Format::OpenMetrics,
            "case, spaces and quotes do not matter"
        );
    }

    #[test]
    fn weights_decide_and_zero_refuses() {
        assert_eq!(
            of("application/openmetrics-text;q=0"),
            Format::Text004,
            "q=0 is not acceptable"
        );
        assert_eq!(
            of("application/openmetrics-text;q=0.000,*/*"),
            Format::Text004,
            "q=0.000 is not acceptable"
        );
        assert_eq!(
            of("application/openmetrics-text;q=0.3,text/plain;q=0.4"),
            Format::Text004,
            "text preferred by weight"
        );
        assert_eq!(
            of("text/plain;q=0.4,application/openmetrics-text;q=0.5"),
            Format::OpenMetrics,
            "OpenMetrics preferred by weight, whatever the order"
        );
        assert_eq!(
            of("application/openmetrics-text,*/*"),
            Format::OpenMetrics,
            "equal weights: the explicit type beats */*"
        );
        assert_eq!(
            of("text/plain,application/openmetrics-text"),
            Format::Text004,
            "full tie: the earlier range"
        );
        assert_eq!(
            negotiate(["text/plain;q=0.2", "application/openmetrics-text;q=0.9"]),
            Format::OpenMetrics,
            "several Accept headers form one list"
        );
    }

    #[test]
    fn versions_and_bad_weights_we_cannot_honour_are_skipped() {
        assert_eq!(
            of("application/openmetrics-text;version=0.0.1"),
            Format::Text004,
            "only 0.0.1: not what we encode"
        );
        assert_eq!(
            of("application/openmetrics-text;version=2.0.0,*/*;q=0.1"),
            Format::Text004,
            "a version we do not serve"
        );
        for weight in ["1.5", "-1", "0.0001", "abc", "", ".5"] {
            assert_eq!(
                of(&format!("application/openmetrics-text;q={weight}")),
                Format::Text004,
                "q={weight} is not a weight: the range is ignored"
            );
        }
        assert_eq!(parse_weight("0.5"), Some(500), "0.5 is 500 thousandths");
        assert_eq!(parse_weight("1.0"), Some(1000), "1.0 is 1000 thousandths");
        assert_eq!(parse_weight("0.25"), Some(250), "0.25 is 250 thousandths");
    }
}
