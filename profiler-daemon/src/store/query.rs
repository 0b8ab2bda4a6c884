//! What a reader asks the store for: a time window and filters.

/// Which samples a query keeps: OR within a filter, AND across filters; an
/// empty filter keeps everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub pids: Vec<u32>,
    pub tids: Vec<u32>,
    pub comms: Vec<String>,
}

impl Filter {
    pub fn matches(&self, pid: u32, tid: u32, comm: &str) -> bool {
        (self.pids.is_empty() || self.pids.contains(&pid))
            && (self.tids.is_empty() || self.tids.contains(&tid))
            && (self.comms.is_empty() || self.comms.iter().any(|wanted| wanted == comm))
    }
}

/// Seconds since the Unix epoch, inclusive start, exclusive end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start: u64,
    pub end: u64,
}

impl Window {
    pub const ALL: Window = Window {
        start: 0,
        end: u64::MAX,
    };

    /// The last `seconds` seconds up to and including second `now`.
    pub fn last(seconds: u64, now: u64) -> Self {
        Window {
            start: (now + 1).saturating_sub(seconds),
            end: now + 1,
        }
    }

    pub fn contains(&self, second: u64) -> bool {
        self.start <= second && second < self.end
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    pub window: Window,
    pub filter: Filter,
}
