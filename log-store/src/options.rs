//! Log configuration: [`LogOptions`] (every limit carries its unit in its name) and
//! [`FsyncPolicy`] with its textual form for CLI flags. Validation only; no I/O.
#![forbid(unsafe_code)]

use std::fmt;
use std::str::FromStr;

/// When appended records are forced to stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Never fsync; records are visible at once and survive a process crash (page cache) but
    /// not a power loss.
    Never,
    /// fsync at most once per `interval_ms` (group commit); records become visible when synced.
    Interval { interval_ms: u64 },
    /// fsync at every `poll_sync` that finds unsynced records (group commit per reactor turn).
    Always,
    /// Group commit as soon as possible: when records are unsynced and no sync is in flight,
    /// one starts at once (the caller runs it asynchronously: [`crate::Log::begin_sync`]);
    /// records appended meanwhile are covered by the next one. Records become visible when
    /// the sync covering them completes.
    Group,
}

/// Why a textual fsync policy was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsyncPolicyError {
    /// Not one of `never`, `always`, `interval`, `interval:<ms>`.
    Unknown(String),
    /// `interval:<ms>` with a value that is not a positive decimal number of milliseconds.
    BadIntervalMs(String),
}

impl fmt::Display for FsyncPolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsyncPolicyError::Unknown(s) => write!(
                f,
                "unknown fsync policy {s:?}: expected never, group, always or interval:<ms>"
            ),
            FsyncPolicyError::BadIntervalMs(s) => {
                write!(
                    f,
                    "fsync interval {s:?} is not a positive number of milliseconds"
                )
            }
        }
    }
}

impl std::error::Error for FsyncPolicyError {}

/// Interval used by the bare word `interval`.
pub const FSYNC_INTERVAL_MS_DEFAULT: u64 = 10;

impl FromStr for FsyncPolicy {
    type Err = FsyncPolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "never" => Ok(FsyncPolicy::Never),
            "group" => Ok(FsyncPolicy::Group),
            "always" => Ok(FsyncPolicy::Always),
            "interval" => Ok(FsyncPolicy::Interval {
                interval_ms: FSYNC_INTERVAL_MS_DEFAULT,
            }),
            _ => {
                let ms = s
                    .strip_prefix("interval:")
                    .ok_or_else(|| FsyncPolicyError::Unknown(s.to_owned()))?;
                let bad = || FsyncPolicyError::BadIntervalMs(ms.to_owned());
                if ms.is_empty() || !ms.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                let interval_ms: u64 = ms.parse().map_err(|_| bad())?;
                if interval_ms == 0 {
                    return Err(bad());
                }
                Ok(FsyncPolicy::Interval { interval_ms })
            }
        }
    }
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsyncPolicy::Never => write!(f, "never"),
            FsyncPolicy::Always => write!(f, "always"),
            FsyncPolicy::Group => write!(f, "group"),
            FsyncPolicy::Interval { interval_ms } => write!(f, "interval:{interval_ms}"),
        }
    }
}

/// Smallest accepted segment size.
pub const SEGMENT_BYTES_MIN: u64 = 64 * 1024;
/// Largest accepted segment size (offsets inside a segment are `u32`).
pub const SEGMENT_BYTES_MAX: u64 = 1 << 31;
/// Default segment size.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default framed-record limit.
pub const RECORD_BYTES_MAX_DEFAULT: u32 = 1024 * 1024;

/// Configuration of a [`crate::Log`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOptions {
    /// Size of each preallocated segment file; a multiple of 4096 in
    /// [`SEGMENT_BYTES_MIN`, `SEGMENT_BYTES_MAX`]. Default 64 MiB.
    pub segment_bytes: u64,
    /// Keep at most this many bytes of segment files (the active segment is always kept);
    /// `None` = unbounded.
    pub retain_bytes: Option<u64>,
    /// Delete sealed segments whose newest record is older than this; `None` = forever.
    pub retain_secs: Option<u64>,
    /// When to fsync.
    pub fsync: FsyncPolicy,
    /// Largest framed SSE record accepted by `append`. Default 1 MiB.
    pub record_bytes_max: u32,
    /// The epoch of a log this open creates (`None`: random). A log that already exists keeps
    /// its own; the caller compares [`crate::Log::epoch`]. Cluster mode derives every node's
    /// epoch from the replicated stream, so all nodes' IDs agree.
    pub epoch_on_create: Option<crate::Epoch>,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            retain_bytes: None,
            retain_secs: None,
            fsync: FsyncPolicy::Never,
            record_bytes_max: RECORD_BYTES_MAX_DEFAULT,
            epoch_on_create: None,
        }
    }
}

/// Why a [`LogOptions`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogOptionsError {
    SegmentBytesOutOfRange {
        segment_bytes: u64,
    },
    SegmentBytesNotPageMultiple {
        segment_bytes: u64,
    },
    /// A record of `record_bytes_max` plus its bookkeeping must fit in one segment.
    RecordBytesMaxTooLarge {
        record_bytes_max: u32,
        segment_bytes: u64,
    },
    RecordBytesMaxZero,
    RetainBytesBelowSegment {
        retain_bytes: u64,
        segment_bytes: u64,
    },
    /// Epoch 0 is not an epoch (IDs could not tell it from an unset one).
    EpochZero,
}

impl fmt::Display for LogOptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogOptionsError::EpochZero => write!(f, "epoch_on_create must not be 0"),
            LogOptionsError::SegmentBytesOutOfRange { segment_bytes } => write!(
                f,
                "segment_bytes {segment_bytes} outside [{SEGMENT_BYTES_MIN}, {SEGMENT_BYTES_MAX}]"
            ),
            LogOptionsError::SegmentBytesNotPageMultiple { segment_bytes } => {
                write!(f, "segment_bytes {segment_bytes} is not a multiple of 4096")
            }
            LogOptionsError::RecordBytesMaxTooLarge {
                record_bytes_max,
                segment_bytes,
            } => write!(
                f,
                "record_bytes_max {record_bytes_max} does not fit a segment of {segment_bytes} bytes"
            ),
            LogOptionsError::RecordBytesMaxZero => write!(f, "record_bytes_max is 0"),
            LogOptionsError::RetainBytesBelowSegment {
                retain_bytes,
                segment_bytes,
            } => write!(
                f,
                "retain_bytes {retain_bytes} is below one segment ({segment_bytes} bytes)"
            ),
        }
    }
}

impl std::error::Error for LogOptionsError {}

impl LogOptions {
    /// Checks every limit; `Log::open` calls this first.
    pub fn validate(&self) -> Result<(), LogOptionsError> {
        let segment_bytes = self.segment_bytes;
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&segment_bytes) {
            return Err(LogOptionsError::SegmentBytesOutOfRange { segment_bytes });
        }
        if !segment_bytes.is_multiple_of(4096) {
            return Err(LogOptionsError::SegmentBytesNotPageMultiple { segment_bytes });
        }
        if self.record_bytes_max == 0 {
            return Err(LogOptionsError::RecordBytesMaxZero);
        }
        let overhead = crate::format::SEGMENT_OVERHEAD_BYTES as u64;
        if u64::from(self.record_bytes_max) + overhead > segment_bytes {
            return Err(LogOptionsError::RecordBytesMaxTooLarge {
                record_bytes_max: self.record_bytes_max,
                segment_bytes,
            });
        }
        if let Some(retain_bytes) = self.retain_bytes
            && retain_bytes < segment_bytes
        {
            return Err(LogOptionsError::RetainBytesBelowSegment {
                retain_bytes,
                segment_bytes,
            });
        }
        if self.epoch_on_create == Some(crate::Epoch(0)) {
            return Err(LogOptionsError::EpochZero);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsync_policy_text() {
        assert_eq!("never".parse(), Ok(FsyncPolicy::Never));
        assert_eq!("always".parse(), Ok(FsyncPolicy::Always));
        assert_eq!(
            "interval".parse(),
            Ok(FsyncPolicy::Interval { interval_ms: 10 })
        );
        assert_eq!(
            "interval:250".parse(),
            Ok(FsyncPolicy::Interval { interval_ms: 250 })
        );
        for bad in [
            "interval:0",
            "interval:",
            "interval:+5",
            "interval: 5",
            "interval:1x",
        ] {
            assert!(
                matches!(
                    bad.parse::<FsyncPolicy>(),
                    Err(FsyncPolicyError::BadIntervalMs(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            "Never".parse::<FsyncPolicy>(),
            Err(FsyncPolicyError::Unknown(_))
        ));
        for p in [
            FsyncPolicy::Never,
            FsyncPolicy::Always,
            FsyncPolicy::Interval { interval_ms: 7 },
        ] {
            assert_eq!(p.to_string().parse(), Ok(p));
        }
    }

    #[test]
    fn options_limits() {
        assert_eq!(LogOptions::default().validate(), Ok(()));
        let o = |segment_bytes, record_bytes_max| LogOptions {
            segment_bytes,
            record_bytes_max,
            ..LogOptions::default()
        };
        assert!(o(4096, 100).validate().is_err());
        assert!(o(65536 + 1, 100).validate().is_err());
        assert!(o(65536, 65536).validate().is_err());
        assert_eq!(o(65536, 1000).validate(), Ok(()));
        let r = LogOptions {
            retain_bytes: Some(10),
            ..LogOptions::default()
        };
        assert!(r.validate().is_err());
    }
}
