//! Which drains a request covers: `seconds=N`, the last N seconds, or
//! `start=` and `end=`, an explicit window in Unix milliseconds.

use std::fmt;

use super::{Limits, ParamError, Quoted, parse_decimal};
use crate::profile::Window;

/// Go's net/http/pprof profiles this long when `seconds` is missing or invalid.
const GO_DEFAULT_SECONDS: u64 = 30;
pub(super) const DEFAULT_SECONDS: u64 = 10;

/// The drains a strict request covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Span {
    /// `seconds=N`: the last N seconds, up to a drain that serves the request.
    Last(u64),
    /// `start=S&end=E`: exactly `Window { start_ms: S, end_ms: E }`, the
    /// drains at times S <= t < E. Answered from what is stored: a window
    /// is reproducible (a pushed one included) only if nothing drains for it.
    Between(Window),
}

impl fmt::Display for Span {
    /// For messages: "... samples in {span}".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Span::Last(seconds) => write!(f, "the last {seconds} seconds"),
            Span::Between(window) => write!(
                f,
                "the window start={} end={} (Unix ms)",
                window.start_ms, window.end_ms
            ),
        }
    }
}

/// The part of `window` the store holds now, given its newest drain: the
/// end is cut at that drain, so an end in the future neither waits for the
/// drains up to it nor claims time nobody has sampled yet, and the answer
/// (shared and kept by window) stays what later drains cannot change.
pub fn stored_part(window: Window, newest_drain_ms: Option<u64>) -> Window {
    let stored_end = newest_drain_ms.map_or(0, |ms| ms.saturating_add(1));
    Window {
        start_ms: window.start_ms,
        end_ms: window.end_ms.min(stored_end).max(window.start_ms),
    }
}

/// The window parameters as given, each at most once (Go's `seconds`: the
/// first one).
#[derive(Default)]
pub(super) struct Given {
    seconds: Option<u64>,
    start: Option<u64>,
    end: Option<u64>,
}

impl Given {
    pub(super) fn strict_seconds(&mut self, value: &str, limits: &Limits) -> Result<(), ParamError> {
        if self.seconds.is_some() {
            return Err(ParamError::Repeated { name: "seconds" });
        }
        let seconds = parse_decimal(value)
            .filter(|seconds| (1..=limits.max_seconds).contains(seconds))
            .ok_or_else(|| seconds_error(value, limits))?;
        self.seconds = Some(seconds);
        Ok(())
    }

    pub(super) fn go_seconds(&mut self, value: &str, limits: &Limits) -> Result<(), ParamError> {
        // Go reads the first value only, as a signed 64-bit integer, and
        // falls back on anything else.
        if self.seconds.is_some() {
            return Ok(());
        }
        self.seconds = Some(match value.parse::<i64>() {
            Ok(seconds) if seconds > 0 => {
                let seconds = seconds.unsigned_abs();
                if seconds > limits.max_seconds {
                    return Err(seconds_error(value, limits));
                }
                seconds
            }
            _ => GO_DEFAULT_SECONDS.min(limits.max_seconds),
        });
        Ok(())
    }

    /// `start` or `end`: a Unix time in milliseconds.
    pub(super) fn bound(&mut self, name: &'static str, value: &str) -> Result<(), ParamError> {
        let slot = if name == "start" {
            &mut self.start
        } else {
            &mut self.end
        };
        if slot.is_some() {
            return Err(ParamError::Repeated { name });
        }
        *slot = Some(parse_decimal(value).ok_or_else(|| ParamError::Invalid {
            name,
            value: Quoted::new(value),
            expected: "a Unix time in milliseconds (digits only)".to_owned(),
        })?);
        Ok(())
    }

    /// The strict endpoints' window: `seconds`, or `start` and `end`
    /// together, or by default the last [`DEFAULT_SECONDS`].
    pub(super) fn span(self, limits: &Limits) -> Result<Span, ParamError> {
        let (start, end) = match (self.seconds, self.start, self.end) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => return Err(ParamError::SecondsAndWindow),
            (Some(seconds), None, None) => return Ok(Span::Last(seconds)),
            (None, None, None) => return Ok(Span::Last(DEFAULT_SECONDS.min(limits.max_seconds))),
            (None, Some(_), None) => {
                return Err(ParamError::HalfWindow {
                    given: "start",
                    missing: "end",
                });
            }
            (None, None, Some(_)) => {
                return Err(ParamError::HalfWindow {
                    given: "end",
                    missing: "start",
                });
            }
            (None, Some(start), Some(end)) => (start, end),
        };
        if start >= end {
            return Err(ParamError::EmptyWindow { start, end });
        }
        // The bound `seconds` has: the retention.
        let max_ms = limits.max_seconds.saturating_mul(1000);
        if end - start > max_ms {
            return Err(ParamError::WindowTooLong {
                ms: end - start,
                max_ms,
            });
        }
        Ok(Span::Between(Window {
            start_ms: start,
            end_ms: end,
        }))
    }

    /// The Go endpoints' seconds: 30 unless given (or the retention if shorter).
    pub(super) fn into_go_seconds(self, limits: &Limits) -> u64 {
        self.seconds
            .unwrap_or_else(|| GO_DEFAULT_SECONDS.min(limits.max_seconds))
    }
}

fn seconds_error(value: &str, limits: &Limits) -> ParamError {
    ParamError::Invalid {
        name: "seconds",
        value: Quoted::new(value),
        expected: format!("an integer from 1 to {} (the retention)", limits.max_seconds),
    }
}

#[cfg(test)]
mod tests;
