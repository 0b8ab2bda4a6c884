//! The time range a profile covers.

/// A time range in milliseconds since the Unix epoch, inclusive start,
/// exclusive end, matched against the time of each drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub start_ms: u64,
    pub end_ms: u64,
}

impl Window {
    pub const ALL: Window = Window {
        start_ms: 0,
        end_ms: u64::MAX,
    };

    /// The `seconds` seconds up to and including millisecond `now_ms`: a
    /// drain exactly `seconds` before `now_ms` belongs to the window before.
    pub fn last(seconds: u64, now_ms: u64) -> Self {
        Window {
            start_ms: now_ms
                .saturating_sub(seconds.saturating_mul(1000))
                .saturating_add(1),
            end_ms: now_ms.saturating_add(1),
        }
    }

    /// Samples drained after the drain at `after_ms`, up to and including the
    /// drain at `until_ms`: exactly what was sampled between two drains.
    pub fn between_drains(after_ms: u64, until_ms: u64) -> Self {
        Window {
            start_ms: after_ms.saturating_add(1),
            end_ms: until_ms.saturating_add(1),
        }
    }

    pub fn contains(&self, time_ms: u64) -> bool {
        self.start_ms <= time_ms && time_ms < self.end_ms
    }

    pub fn duration_ms(&self) -> u64 {
        self.end_ms.saturating_sub(self.start_ms)
    }
}
