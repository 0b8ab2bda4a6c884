//! What is wrong with a config file, and where: `FILE:LINE:` as editors
//! and `journalctl` readers jump to.

/// Every error names the file and, when known, the line (`FILE:LINE:`), so
/// editors and `journalctl` readers land on it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{}{message}", line_prefix(*.line))]
    Parse {
        path: String,
        line: Option<usize>,
        message: String,
    },
    #[error("{path}:{}{key} = {value} is out of range; expected {min} to {max}", line_prefix(*.line))]
    OutOfRange {
        path: String,
        line: Option<usize>,
        key: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
}

fn line_prefix(line: Option<usize>) -> String {
    line.map_or_else(|| " ".to_owned(), |line| format!("{line}: "))
}

/// toml's own message (which names an unknown key and lists the known ones),
/// on one line, at `FILE:LINE:`; for a bad value, the key it belongs to.
pub(super) fn parse_error(text: &str, path: &str, err: &toml::de::Error) -> ConfigError {
    let message = err.message().split_whitespace().collect::<Vec<_>>().join(" ");
    let line = err.span().map(|span| line_number(text, span.start));
    let key = line
        .and_then(|line| text.lines().nth(line - 1))
        .and_then(|text| text.split_once('='))
        .map(|(key, _)| key.trim().trim_matches('"'))
        .filter(|key| !key.is_empty() && !message.contains(&format!("`{key}`")));
    ConfigError::Parse {
        path: path.to_owned(),
        line,
        message: match key {
            Some(key) => format!("{key}: {message}"),
            None => message,
        },
    }
}

/// 1-based line of a byte offset.
fn line_number(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&byte| byte == b'\n')
        .count()
        + 1
}

/// The 1-based line where `key = ...` is set, for a value that parsed but is invalid.
pub(super) fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            line.split_once('=')
                .is_some_and(|(name, _)| name.trim().trim_matches('"') == key)
        })
        .map(|index| index + 1)
}
