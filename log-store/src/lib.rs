//! `log_store`: a segmented, memory-mapped append log of pre-framed SSE records, shared by many
//! streams, with a pure resume planner. It knows nothing about sockets, HTTP or io_uring: it
//! hands out byte slices ([`LogSlice`]) that a driver points its sends at.
//!
//! # Layout
//! - [`event_id`]: the textual event ID `{epoch:016x}-{stream}-{seq}`, strict parse and format.
//! - [`options`]: [`LogOptions`] (every limit, with units) and [`FsyncPolicy`].
//! - `frame` (private): SSE framing of one event into bytes, done once at append.
//! - `format` (private): byte layout of segment headers, record entries and the checkpoint
//!   (see `DESIGN.md`); pure encode/decode.
//! - `mmap` (private): the only module with `unsafe` — the mapped segment memory and its
//!   write token, plus `posix_fallocate`.
//! - [`log`]: [`Log`] — open/recover, create/remove streams, append, group-commit sync, read,
//!   retention.
//! - [`resume`]: the pure resume planner (decision table), no I/O.
//! - `sim` (feature `sim` only): the simulator's hook on flushes and preallocations.
//!
//! # Example
//! ```
//! use log_store::{Log, LogOptions};
//! let dir = tempfile::tempdir()?;
//! let opts = LogOptions { segment_bytes: 1 << 20, record_bytes_max: 64 << 10, ..LogOptions::default() };
//! let mut log = Log::open(dir.path(), opts)?;
//! let s = log.create_stream("orders")?;
//! let a = log.append(s, Some("update"), b"{\"id\":1}\nsecond line")?;
//! let batch = log.read(s, 1, 64 << 10)?; // fsync=never: visible at once
//! let framed = format!("id: {}\nevent: update\ndata: {{\"id\":1}}\ndata: second line\n\n", a.id);
//! assert_eq!(batch.slices[0].as_bytes(), framed.as_bytes());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A [`Log`] has exactly one writer (the owning thread). It is `Send`, not `Sync`.
//! Readers get [`LogSlice`]s that keep their segment mapped (and its file on disk) for as long
//! as they live, even across retention.
//!
//! By default every storage call happens on the writer's thread. [`prepare_in_background`]
//! (next segment files, retention checkpoints) and [`retire_in_background`] (unmapping and
//! unlinking retired segments) move what blocks once per segment to two background threads,
//! for event loops that must not block (see `DESIGN.md`, "Segment roll").

pub mod event_id;
mod format;
mod frame;
pub mod log;
mod mmap;
pub mod options;
pub mod resume;
#[cfg(feature = "sim")]
pub mod sim;

pub use event_id::{EVENT_ID_BYTES_MAX, Epoch, EventId, EventIdError, Seq, StreamId};
pub use log::prepare_in_background;
pub use log::retire::retire_in_background;
pub use log::{
    AppendError, Appended, Bounds, KEY_BYTES_MAX, KeyRecord, Log, LogSlice, OpenError, ReadBatch,
    ReadError, RemoveError, Removed, RetentionError, RetentionReport, RollCounts, SyncError,
    SyncJob, SyncReport,
};
pub use options::{FsyncPolicy, FsyncPolicyError, LogOptions, LogOptionsError};
pub use resume::{
    Detail, Refusal, ResumeClass, ResumeInput, ResumeOutcome, ResumePlan, WindowView, plan_resume,
};
