//! Flame graphs as interactive SVG, drawn by inferno from the folded stacks.

use std::io;

use inferno::flamegraph::{self, Direction, Options, color::MultiPalette};

use super::{Profile, folded};

/// Writes `profile` as an SVG flame graph (an icicle graph if `icicle`).
/// Kernel frames (`_[k]`) are orange, C++/Rust `::` names yellow, others red.
pub fn write(profile: &Profile, title: &str, icicle: bool, out: &mut impl io::Write) -> io::Result<()> {
    let lines = folded::folded_lines(profile);
    if lines.is_empty() {
        return write_empty(title, out);
    }
    let lines: Vec<String> = lines
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect();
    let mut options = Options::default();
    options.title = title.to_owned();
    options.colors = flamegraph::color::Palette::Multi(MultiPalette::Perl);
    options.count_name = "samples".to_owned();
    options.hash = true;
    if icicle {
        options.direction = Direction::Inverted;
    }
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}

/// inferno refuses empty input; an empty window still gets a readable picture.
fn write_empty(title: &str, out: &mut impl io::Write) -> io::Result<()> {
    write!(
        out,
        r#"<?xml version="1.0" standalone="no"?><svg version="1.1" width="1200" height="60" xmlns="http://www.w3.org/2000/svg"><text x="600" y="24" text-anchor="middle" font-family="Verdana" font-size="17">{}</text><text x="600" y="48" text-anchor="middle" font-family="Verdana" font-size="12">no samples in this window</text></svg>"#,
        escape_xml(title)
    )
}

pub fn escape_xml(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Window;

    #[test]
    fn an_empty_profile_is_still_an_svg_with_an_escaped_title() {
        let profile = Profile {
            window: Window::ALL,
            frequency: 99,
            samples: Vec::new(),
        };
        let mut out = Vec::new();
        write(&profile, "pid <1> & co", false, &mut out).expect("writing to a Vec");
        let svg = String::from_utf8(out).expect("utf-8");
        assert!(
            svg.starts_with("<?xml") && svg.contains("pid &lt;1&gt; &amp; co"),
            "{svg}"
        );
    }
}
