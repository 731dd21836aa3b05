//! Idempotent publishing (`Idempotency-Key`): a core's table of the keys its streams' publishes
//! carried, so a retry within `--idempotency-window-secs` stores nothing and gets the original
//! IDs again, and the same key with another body is refused. Bounded per stream
//! (`--idempotency-keys-per-stream-max`) and in total (`--idempotency-keys-max`), the oldest
//! key evicted first. No I/O; time is passed in.
//!
//! What it does not do yet: the table is in memory, so a restart forgets it (the key is not
//! in the log's record format).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use log_store::EventId;

use super::StreamKey;
use super::hub::Hub;
use super::publish::{self, Published};
use crate::proto::access::with_headers;
use crate::proto::http;

/// The hash of a publish's events a key is bound to (FNV-1a over each event's type and data,
/// each prefixed by its length: stable across processes and versions).
pub fn body_hash(events: &[(Option<String>, Vec<u8>)]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (ev, data) in events {
        eat(ev.as_deref().map_or(b"\0" as &[u8], str::as_bytes));
        eat(data);
    }
    h
}

/// The table's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub window: Duration,
    pub per_stream_max: usize,
    pub total_max: usize,
}

impl Limits {
    /// One core's share of the flags (`--idempotency-keys-max` is split over the cores).
    pub fn of_flags(
        window_secs: u64,
        per_stream_max: usize,
        total_max: usize,
        cores: usize,
    ) -> Limits {
        Limits {
            window: Duration::from_secs(window_secs),
            per_stream_max,
            total_max: (total_max / cores.max(1)).max(1),
        }
    }
}

/// A publish's `Idempotency-Key` and the hash of its body.
#[derive(Debug, Clone)]
pub struct Keyed {
    pub key: String,
    pub hash: u64,
}

impl Keyed {
    pub fn new(key: String, events: &[(Option<String>, Vec<u8>)]) -> Keyed {
        Keyed {
            hash: body_hash(events),
            key,
        }
    }
}

/// The header a replayed answer carries.
pub const REPLAY_HEADER: &str = "Idempotent-Replay: true\r\n";

/// The answer to a keyed publish that must store nothing: the original IDs again, marked and
/// held until they are durable (as the original was), or the 422 for a reused key.
pub fn known_answer(
    keys: &mut Keys,
    hub: &Hub,
    stream: &str,
    keyed: &Keyed,
    key: StreamKey,
    now: Instant,
    close: bool,
) -> Option<Published> {
    let (answer, wait) = match keys.lookup(stream, &keyed.key, keyed.hash, key.1.0, now) {
        Lookup::New => return None,
        Lookup::Replay { ids, batch } => {
            let (b, wait) = publish::stored_answer(key.0, &ids, false, batch, close);
            // Durable already (the usual case): nothing would release a wait.
            (
                with_headers(b, REPLAY_HEADER),
                wait.filter(|w| !hub.visible(*w)),
            )
        }
        Lookup::Reused => {
            let body = serde_json::json!({
                "error": "idempotency_key_reused",
                "message": "this Idempotency-Key was used on this stream with another body",
            });
            (http::json_response(422, &body, close), None)
        }
    };
    Some(Published {
        answer,
        wait,
        appended: 0,
        ids: Vec::new(),
    })
}

/// What a publish with a key finds.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// No live entry: publish, then [`Keys::insert`].
    New,
    /// The same key and body within the window: answer these IDs again (a batch or not).
    Replay { ids: Vec<EventId>, batch: bool },
    /// The same key with another body: 422.
    Reused,
}

#[derive(Debug)]
struct Entry {
    hash: u64,
    ids: Vec<EventId>,
    batch: bool,
    at: Instant,
    serial: u64,
}

/// One core's keys.
#[derive(Debug)]
pub struct Keys {
    limits: Limits,
    entries: HashMap<(String, String), Entry>,
    /// Every entry by insertion serial (oldest first): (stream, key).
    order: BTreeMap<u64, (String, String)>,
    /// Each stream's entries' serials, oldest first.
    per_stream: HashMap<String, VecDeque<u64>>,
    next_serial: u64,
}

impl Keys {
    pub fn new(limits: Limits) -> Keys {
        Keys {
            limits,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            per_stream: HashMap::new(),
            next_serial: 0,
        }
    }

    /// What a publish of `hash` with `key` on `stream` finds at `now`. An entry past the
    /// window, or one of an earlier stream of the same name (`sid`: the stream's id now), is
    /// forgotten.
    pub fn lookup(&mut self, stream: &str, key: &str, hash: u64, sid: u32, now: Instant) -> Lookup {
        let k = (stream.to_owned(), key.to_owned());
        let Some(e) = self.entries.get(&k) else {
            return Lookup::New;
        };
        let stale = now.duration_since(e.at) >= self.limits.window
            || e.ids.first().is_some_and(|id| id.stream.0 != sid);
        if stale {
            self.remove(e.serial);
            return Lookup::New;
        }
        if e.hash != hash {
            return Lookup::Reused;
        }
        Lookup::Replay {
            ids: e.ids.clone(),
            batch: e.batch,
        }
    }

    /// Remembers a stored publish (replacing an entry of the same key), evicting the stream's
    /// oldest and then the oldest overall past their limits.
    pub fn insert(
        &mut self,
        stream: &str,
        key: &str,
        hash: u64,
        stored: (Vec<EventId>, bool),
        now: Instant,
    ) {
        let k = (stream.to_owned(), key.to_owned());
        if let Some(old) = self.entries.get(&k) {
            self.remove(old.serial);
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let (ids, batch) = stored;
        self.entries.insert(
            k.clone(),
            Entry {
                hash,
                ids,
                batch,
                at: now,
                serial,
            },
        );
        self.order.insert(serial, k);
        let q = self.per_stream.entry(stream.to_owned()).or_default();
        q.push_back(serial);
        if q.len() > self.limits.per_stream_max {
            let oldest = q[0];
            self.remove(oldest);
        }
        while self.entries.len() > self.limits.total_max {
            let (&oldest, _) = self.order.first_key_value().expect("entries are ordered");
            self.remove(oldest);
        }
    }

    /// Remembers `p` under `keyed` if every one of the `n` events was stored.
    pub fn remember(
        &mut self,
        stream: &str,
        keyed: Option<Keyed>,
        p: &Published,
        n: usize,
        batch: bool,
        now: Instant,
    ) {
        if let Some(k) = keyed.filter(|_| p.ids.len() == n && n > 0) {
            self.insert(stream, &k.key, k.hash, (p.ids.clone(), batch), now);
        }
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn remove(&mut self, serial: u64) {
        let Some(k) = self.order.remove(&serial) else {
            return;
        };
        self.entries.remove(&k);
        if let Some(q) = self.per_stream.get_mut(&k.0) {
            q.retain(|&s| s != serial);
            if q.is_empty() {
                self.per_stream.remove(&k.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use log_store::{Epoch, StreamId};

    fn id(sid: u32, seq: u64) -> EventId {
        EventId {
            epoch: Epoch(7),
            stream: StreamId(sid),
            seq,
        }
    }

    fn keys(per_stream_max: usize, total_max: usize) -> Keys {
        Keys::new(Limits {
            window: Duration::from_secs(600),
            per_stream_max,
            total_max,
        })
    }

    #[test]
    fn hashes_tell_bodies_and_types_apart() {
        let e = |t: Option<&str>, d: &str| vec![(t.map(String::from), d.as_bytes().to_vec())];
        assert_eq!(body_hash(&e(None, "x")), body_hash(&e(None, "x")));
        assert_ne!(body_hash(&e(None, "x")), body_hash(&e(None, "y")));
        assert_ne!(body_hash(&e(None, "x")), body_hash(&e(Some("t"), "x")));
        let two = vec![(None, b"ab".to_vec()), (None, b"c".to_vec())];
        let other = vec![(None, b"a".to_vec()), (None, b"bc".to_vec())];
        assert_ne!(body_hash(&two), body_hash(&other));
    }

    #[test]
    fn a_repeat_replays_another_body_is_refused_and_the_window_ends_it() {
        let mut k = keys(10, 10);
        let t0 = Instant::now();
        assert_eq!(k.lookup("s", "k1", 5, 0, t0), Lookup::New);
        k.insert("s", "k1", 5, (vec![id(0, 1)], false), t0);
        let replay = Lookup::Replay {
            ids: vec![id(0, 1)],
            batch: false,
        };
        assert_eq!(k.lookup("s", "k1", 5, 0, t0), replay);
        assert_eq!(k.lookup("s", "k1", 6, 0, t0), Lookup::Reused);
        assert_eq!(k.lookup("t", "k1", 6, 0, t0), Lookup::New, "per stream");
        assert_eq!(
            k.lookup("s", "k1", 5, 3, t0),
            Lookup::New,
            "a new stream of that name"
        );
        k.insert("s", "k1", 5, (vec![id(0, 1)], false), t0);
        let later = t0 + Duration::from_secs(600);
        assert_eq!(
            k.lookup("s", "k1", 5, 0, later),
            Lookup::New,
            "past the window"
        );
        assert!(k.is_empty());
    }

    #[test]
    fn the_oldest_key_goes_first_per_stream_and_in_total() {
        let mut k = keys(2, 3);
        let t = Instant::now();
        for (s, key) in [("a", "1"), ("a", "2"), ("a", "3")] {
            k.insert(s, key, 0, (vec![id(0, 1)], false), t);
        }
        assert_eq!(k.len(), 2);
        assert_eq!(
            k.lookup("a", "1", 0, 0, t),
            Lookup::New,
            "a's oldest evicted"
        );
        k.insert("b", "1", 0, (vec![id(1, 1)], false), t);
        k.insert("b", "2", 0, (vec![id(1, 2)], false), t);
        assert_eq!(k.len(), 3);
        assert_eq!(
            k.lookup("a", "2", 0, 0, t),
            Lookup::New,
            "the oldest overall evicted"
        );
        assert!(matches!(k.lookup("a", "3", 0, 0, t), Lookup::Replay { .. }));
        assert!(matches!(k.lookup("b", "2", 0, 1, t), Lookup::Replay { .. }));
    }
}
