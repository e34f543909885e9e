//! `protect`: the adaptive concurrency limit in front of the app (see `crate::protect`), and
//! the priorities requests wait and are shed in. Absent, nothing of it runs.

use std::fmt;
use std::time::Duration;

pub const DEFAULT_MAX_WAIT: Duration = Duration::from_millis(50);
pub const DEFAULT_MIN_LIMIT: u32 = 1;
pub const DEFAULT_MAX_LIMIT: u32 = 1000;
/// `latency: 2x` unless configured.
pub const DEFAULT_LATENCY_MULTIPLE: f64 = 2.0;

/// The validated `protect:` section.
#[derive(Debug, Clone, PartialEq)]
pub struct Protect {
    pub mode: ProtectMode,
    pub latency: LatencyTarget,
    /// How long a request may wait for a slot before it is shed.
    pub max_wait: Duration,
    pub min_limit: u32,
    pub max_limit: u32,
}

/// `mode:`: `enforce` sheds; `shadow` decides and measures everything and never sheds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtectMode {
    Enforce,
    Shadow,
}

impl ProtectMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ProtectMode::Enforce => "enforce",
            ProtectMode::Shadow => "shadow",
        }
    }
}

/// `latency:`: what admitted requests' time to the response head should keep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatencyTarget {
    /// A multiple of the app's own unloaded latency, learned continuously (`2x`).
    Multiple(f64),
    /// An absolute duration (`250ms`).
    Absolute(Duration),
}

impl fmt::Display for LatencyTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LatencyTarget::Multiple(m) => write!(f, "{m}x the unloaded latency"),
            LatencyTarget::Absolute(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

/// How important a request is to the app: waiting requests are served highest first, and the
/// lowest is shed first. Ordered: `Low < Normal < High < Critical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    Low = 0,
    #[default]
    Normal = 1,
    High = 2,
    Critical = 3,
}

impl Priority {
    /// Lowest first: the order they are shed in.
    pub const ALL: [Priority; 4] = [
        Priority::Low,
        Priority::Normal,
        Priority::High,
        Priority::Critical,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }

    pub fn parse(text: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == text)
    }

    /// 0 (low) to 3 (critical): an index into per-priority tables.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
