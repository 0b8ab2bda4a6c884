//! An error as text, with its causes.
//!
//! The daemon's errors follow one rule: a variant's message says what failed
//! ("reading /etc/profilerd.toml"), and its cause is its `source()`, never
//! also part of its message, so a chain (`{err:#}` in main, [`Chain`] in logs)
//! prints every cause once.

use std::{error::Error, fmt};

/// `error` and each of its causes, joined by ": " (as anyhow's `{:#}`): for
/// logs, for main's last word, and for messages that keep an error as text.
///
/// A cause whose text its parent's message already holds is left out: aya's
/// errors (and other crates') format their source and also return it, which
/// would otherwise print "failed to create map `X`" three times in a row.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parent = self.0.to_string();
        f.write_str(&parent)?;
        let mut cause = self.0.source();
        while let Some(err) = cause {
            let text = err.to_string();
            if !parent.contains(&text) {
                write!(f, ": {text}")?;
            }
            parent = text;
            cause = err.source();
        }
        Ok(())
    }
}

/// Panics unless every error in `error`'s chain leaves its cause out of its
/// own message (the cause would otherwise be printed twice).
#[cfg(test)]
pub(crate) fn assert_each_cause_once(error: &(dyn Error + 'static)) {
    let mut current = Some(error);
    while let Some(err) = current {
        if let Some(cause) = err.source() {
            let (message, cause) = (err.to_string(), cause.to_string());
            assert!(!cause.is_empty(), "{message:?} has a cause with no message");
            assert!(
                !message.contains(&cause),
                "{message:?} repeats its cause {cause:?}; the whole chain: {}",
                Chain(error)
            );
        }
        current = err.source();
    }
}

#[cfg(test)]
mod tests;
