//! `--streams-per-subject-max`: how many API streams one subject's publishes may create, so
//! one tenant cannot fill `--streams-max` for everyone. A subject is a token's issuer and
//! `sub`; anonymous requests (and tokens without `sub`) count as one subject per source
//! address. Only creations count (a subscribe creates nothing; publishing to an existing
//! stream is free), and a stream's place goes back to its creator when it is removed (`DELETE`,
//! idle expiry). Streams found at start have no known creator and count for no one. Shared by
//! all cores; no I/O.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use auth::Access;

use super::catalog::{StreamKind, StreamQuota, StreamsExhausted};
use crate::metrics::CoreMetrics;

/// Who created a stream, for the quota: never printed (it holds a token's subject).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Subject(String);

impl Subject {
    /// A token's subject (`iss` and `sub`), or the source address when it names none.
    pub fn of(access: &Access, peer: Option<IpAddr>) -> Subject {
        match (&access.subject, peer) {
            (Some(sub), _) => {
                let iss = access.issuer.as_deref().unwrap_or("");
                Subject(format!("t:{}:{iss}:{sub}", iss.len()))
            }
            (None, Some(ip)) => Subject(format!("a:{ip}")),
            (None, None) => Subject("a:".into()),
        }
    }
}

impl fmt::Debug for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Subject(..)")
    }
}

/// A creation refused: the subject created `--streams-per-subject-max` streams already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubjectQuotaExceeded {
    pub max: u64,
}

impl SubjectQuotaExceeded {
    /// The answer's status and error code.
    pub const STATUS: u16 = 429;
    pub const CODE: &'static str = "subject_quota";
}

impl fmt::Display for SubjectQuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "this caller created --streams-per-subject-max {} streams; publish to an existing \
             stream, or delete one first",
            self.max
        )
    }
}

/// A new API stream refused by one of the two quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateRefused {
    Streams(StreamsExhausted),
    Subject(SubjectQuotaExceeded),
}

impl CreateRefused {
    /// The answer's status and error code.
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            CreateRefused::Streams(_) => (StreamsExhausted::STATUS, StreamsExhausted::CODE),
            CreateRefused::Subject(_) => (SubjectQuotaExceeded::STATUS, SubjectQuotaExceeded::CODE),
        }
    }

    /// Its counter: `gateway_refusals_total{reason="streams_exhausted" | "subject_quota"}`.
    pub fn counter<'a>(&self, m: &'a CoreMetrics) -> &'a AtomicU64 {
        match self {
            CreateRefused::Streams(_) => &m.streams_exhausted_total,
            CreateRefused::Subject(_) => &m.subject_quota_total,
        }
    }
}

impl fmt::Display for CreateRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateRefused::Streams(e) => e.fmt(f),
            CreateRefused::Subject(e) => e.fmt(f),
        }
    }
}

/// Takes the places of a new stream `stream` that `who` creates: one of `who`'s
/// (`--streams-per-subject-max`), then one of the gateway's (`--streams-max`). Give them back
/// with [`release`] when the creation fails or the stream is removed. An MCP (or internal)
/// stream takes none.
pub fn reserve(
    quota: &StreamQuota,
    subjects: &SubjectQuota,
    who: &Subject,
    stream: &str,
) -> Result<(), CreateRefused> {
    if StreamKind::of(stream) != StreamKind::Api {
        return Ok(());
    }
    subjects
        .reserve(who, stream)
        .map_err(CreateRefused::Subject)?;
    quota.reserve(stream).map_err(|e| {
        subjects.release(stream);
        CreateRefused::Streams(e)
    })
}

/// Gives back the places of `stream` (removed, or its creation failed).
pub fn release(quota: &StreamQuota, subjects: &SubjectQuota, stream: &str) {
    subjects.release(stream);
    quota.release(stream);
}

/// Cluster mode, before a publish that would create `stream` goes out: room under
/// `--streams-max` (the stream is counted when it is born, on every node) and a place of
/// `who`'s, taken now on this node (a publish that is never applied keeps it: at most one per
/// stream name, as a retry takes no other).
pub fn reserve_clustered(
    quota: &StreamQuota,
    subjects: &SubjectQuota,
    who: &Subject,
    stream: &str,
) -> Result<(), CreateRefused> {
    quota.check(stream).map_err(CreateRefused::Streams)?;
    match StreamKind::of(stream) {
        StreamKind::Mcp | StreamKind::Internal => Ok(()),
        StreamKind::Api => subjects
            .reserve(who, stream)
            .map_err(CreateRefused::Subject),
    }
}

/// Streams created per subject (at most `--streams-max` entries: one per live API stream).
#[derive(Debug)]
pub struct SubjectQuota {
    max: u64,
    inner: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    by_subject: HashMap<Subject, u64>,
    creator: HashMap<String, Subject>,
}

impl SubjectQuota {
    pub fn new(max: u64) -> SubjectQuota {
        SubjectQuota {
            max,
            inner: Mutex::default(),
        }
    }

    /// Takes one of `who`'s places for the new stream `stream`; a stream already counted
    /// (a cluster publish retried before its stream was born) takes none.
    pub fn reserve(&self, who: &Subject, stream: &str) -> Result<(), SubjectQuotaExceeded> {
        let mut c = self.inner.lock().expect("subject quota lock");
        if c.creator.contains_key(stream) {
            return Ok(());
        }
        let n = c.by_subject.entry(who.clone()).or_default();
        if *n >= self.max {
            return Err(SubjectQuotaExceeded { max: self.max });
        }
        *n += 1;
        c.creator.insert(stream.to_owned(), who.clone());
        Ok(())
    }

    /// The stream was removed (or its creation failed): its creator's place is free again.
    pub fn release(&self, stream: &str) {
        let mut c = self.inner.lock().expect("subject quota lock");
        let Some(who) = c.creator.remove(stream) else {
            return; // found at start, or an MCP stream: counted for no one
        };
        if let Some(n) = c.by_subject.get_mut(&who) {
            *n -= 1;
            if *n == 0 {
                c.by_subject.remove(&who);
            }
        }
    }

    /// Streams `who` created that are still live.
    pub fn created_by(&self, who: &Subject) -> u64 {
        let c = self.inner.lock().expect("subject quota lock");
        c.by_subject.get(who).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(issuer: Option<&str>, sub: &str) -> Access {
        Access {
            issuer: issuer.map(str::to_owned),
            subject: Some(sub.to_owned()),
            ..Access::anonymous()
        }
    }

    #[test]
    fn each_subject_creates_up_to_its_max_and_removals_give_places_back() {
        let q = SubjectQuota::new(2);
        let a = Subject::of(&token(Some("iss"), "alice"), None);
        let b = Subject::of(&Access::anonymous(), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(q.reserve(&a, "s1"), Ok(()));
        assert_eq!(q.reserve(&a, "s1"), Ok(()), "one stream counts once");
        assert_eq!(q.reserve(&a, "s2"), Ok(()));
        assert_eq!(q.reserve(&a, "s3"), Err(SubjectQuotaExceeded { max: 2 }));
        assert_eq!(
            q.reserve(&b, "s3"),
            Ok(()),
            "another subject has its own places"
        );
        q.release("s1");
        q.release("never-counted");
        assert_eq!(q.created_by(&a), 1);
        assert_eq!(q.reserve(&a, "s3"), Ok(()), "already counted for b");
        assert_eq!(q.reserve(&a, "s4"), Ok(()));
        assert_eq!(q.created_by(&a), 2);
    }

    #[test]
    fn subjects_differ_by_issuer_and_never_print() {
        let one = Subject::of(&token(Some("a:b"), "c"), None);
        let two = Subject::of(&token(Some("a"), "b:c"), None);
        assert_ne!(one, two, "the issuer's length keeps the fields apart");
        let ip = Some("10.0.0.1".parse().unwrap());
        let anon = Subject::of(&Access::anonymous(), ip);
        assert_ne!(anon, Subject::of(&token(None, "a:10.0.0.1"), None));
        assert_eq!(
            anon,
            Subject::of(
                &Access {
                    mcp: true,
                    ..Access::anonymous()
                },
                ip
            )
        );
        assert_eq!(format!("{one:?}"), "Subject(..)");
    }
}
