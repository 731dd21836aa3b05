//! Idempotent publishing (`Idempotency-Key`): a core's table of the keys its streams' publishes
//! carried, so a retry within `--idempotency-window-secs` stores nothing and gets the original
//! IDs again, and the same key with another body is refused. Bounded per stream
//! (`--idempotency-keys-per-stream-max`) and in total (`--idempotency-keys-max`), the oldest
//! key evicted first. No I/O; time is passed in.
//!
//! In cluster mode the key travels with each event through JetStream ([`cluster_header`],
//! [`cluster_msg_id`]) and every node learns it as it applies them ([`Keys::on_applied`]).
//!
//! A stored keyed publish is also written into its shard's log as a *key record* after its
//! events ([`Durable`], `log_store::Log::append_key`; in cluster mode as each node applies
//! the last event), durable with them, so a restart learns the keys of the window back from
//! the log ([`Keys::recover`]).
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use log_store::{EventId, KeyRecord};

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

/// A keyed publish stored whole, to write into its log as a key record after its events
/// (`Hub::append_key`): events `first..first + count`, the key's record bytes
/// ([`record_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durable {
    pub first: EventId,
    pub count: u32,
    pub bytes: Vec<u8>,
}

/// A key record's bytes: `<s|b>/<body hash, 16 hex digits>/<key>` (at most 83 bytes).
pub fn record_bytes(hash: u64, batch: bool, key: &str) -> Vec<u8> {
    let kind = if batch { 'b' } else { 's' };
    format!("{kind}/{hash:016x}/{key}").into_bytes()
}

/// The `<s|b>/<hash>` that a key record and a `Gw-Idempotency` header start with: (batch,
/// hash).
fn kind_and_hash<'a>(it: &mut impl Iterator<Item = &'a str>) -> Option<(bool, u64)> {
    let batch = match it.next()? {
        "b" => true,
        "s" => false,
        _ => return None,
    };
    Some((batch, u64::from_str_radix(it.next()?, 16).ok()?))
}

/// A key record's bytes read back: (batch, hash, key); `None` if not ours.
fn parse_record(bytes: &[u8]) -> Option<(bool, u64, &str)> {
    let s = std::str::from_utf8(bytes).ok()?;
    let mut it = s.splitn(3, '/');
    let (batch, hash) = kind_and_hash(&mut it)?;
    let key = it.next()?;
    crate::proto::route::valid_idempotency_key(key).then_some((batch, hash, key))
}

/// The header a replayed answer carries.
pub const REPLAY_HEADER: &str = "Idempotent-Replay: true\r\n";

impl Keys {
    /// The answer to a keyed publish on `stream` that must store nothing: the original IDs
    /// again, marked and held until they are durable (as the original was; counted), or the
    /// 422 for a reused key. `None`: publish (no key, a new key, or a
    /// stream not created yet).
    pub fn known(
        &mut self,
        hub: &Hub,
        stream: &str,
        keyed: Option<&Keyed>,
        now: Instant,
        close: bool,
    ) -> Option<Published> {
        let (keyed, key) = keyed.zip(hub.stream_key(stream))?;
        let (answer, wait) = match self.lookup(stream, &keyed.key, keyed.hash, key.1.0, now) {
            Lookup::New => return None,
            Lookup::Replay {
                ids,
                batch,
                refused,
            } => {
                self.replays.fetch_add(1, Relaxed);
                let (mut b, wait) = publish::stored_answer(key.0, &ids, false, batch, close);
                if let Some(r) = refused {
                    b = publish::refused_answer(r.status, r.code, &r.message, &ids, close);
                }
                // Durable already (the usual case): nothing would release a wait. Not durable
                // and its log poisoned since: nothing ever will, and the original answer (if
                // its publisher was still there) was the same 500.
                let wait = wait.filter(|w| !hub.visible(*w));
                if wait.is_some_and(|w| hub.poisoned(w.shard())) {
                    let msg = publish::LOG_FAILED;
                    (http::error_response(500, "log_failed", msg, close), None)
                } else {
                    (with_headers(b, REPLAY_HEADER), wait)
                }
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
            refusal: None,
        })
    }
}

/// What a publish with a key finds.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// No live entry: publish, then [`Keys::insert`].
    New,
    /// The same key and body within the window: answer these IDs again (a batch or not), or
    /// the refusal that stopped the publish after them.
    Replay {
        ids: Vec<EventId>,
        batch: bool,
        refused: Option<publish::Refusal>,
    },
    /// The same key with another body: 422.
    Reused,
}

/// In cluster mode, the `Nats-Msg-Id` every retry of event `i` of a keyed publish on `stream`
/// shares (without the body hash: another body under the same key is then not stored either,
/// and its retry gets the 422).
pub fn cluster_msg_id(stream: &str, keyed: &Keyed, i: usize) -> String {
    format!("gw-idem:{stream}:{i}:{}", keyed.key)
}

/// In cluster mode, the `Gw-Idempotency` header of event `i` of `n` of a keyed publish:
/// `<s|b>/<hash, 16 hex digits>/<i>/<n>/<key>`. Every node that applies the events learns the
/// key from it ([`Keys::on_applied`]), so a retry on any node, and on a node rebuilt from
/// JetStream, gets the original IDs.
pub fn cluster_header(keyed: &Keyed, i: usize, n: usize, batch: bool) -> String {
    let kind = if batch { 'b' } else { 's' };
    format!("{kind}/{:016x}/{i}/{n}/{}", keyed.hash, keyed.key)
}

/// A `Gw-Idempotency` header read back: (batch, hash, i, n, key); `None` if malformed (any
/// writer of the subject may send anything: such a header is ignored).
fn parse_cluster_header(h: &str) -> Option<(bool, u64, usize, usize, &str)> {
    let mut it = h.splitn(5, '/');
    let (batch, hash) = kind_and_hash(&mut it)?;
    let i: usize = it.next()?.parse().ok()?;
    let n: usize = it.next()?.parse().ok()?;
    let key = it.next()?;
    // `n` comes from whoever wrote the subject: bounded by what one request can hold (an
    // atomic batch), since it sizes a buffer.
    let ok = i < n
        && n <= cluster::BATCH_MESSAGES_MAX
        && crate::proto::route::valid_idempotency_key(key);
    ok.then_some((batch, hash, i, n, key))
}

/// The key record of a publish stored as `ids`, if they are one run of one stream (a key
/// record names a first event and a count): always so for a local publish and for an atomic
/// batch applied in JetStream order; anything else stays in memory only.
fn durable(ids: &[EventId], hash: u64, batch: bool, key: &str) -> Option<Durable> {
    let first = *ids.first()?;
    let dense = ids.iter().enumerate().all(|(i, id)| {
        id.stream == first.stream && id.epoch == first.epoch && id.seq == first.seq + i as u64
    });
    dense.then(|| Durable {
        first,
        count: ids.len() as u32,
        bytes: record_bytes(hash, batch, key),
    })
}

#[derive(Debug)]
struct Entry {
    hash: u64,
    ids: Vec<EventId>,
    batch: bool,
    /// The publish stopped after `ids` with this refusal (in memory only: no key record).
    refused: Option<publish::Refusal>,
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
    /// Cluster mode: keyed requests whose first events were applied, not yet all.
    partial: HashMap<(String, String), (u64, Vec<EventId>)>,
    /// Replays answered (`gateway_idempotent_replays_total`, read by the metrics export).
    replays: Arc<AtomicU64>,
}

impl Keys {
    pub fn new(limits: Limits, replays: Arc<AtomicU64>) -> Keys {
        Keys {
            limits,
            replays,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            per_stream: HashMap::new(),
            next_serial: 0,
            partial: HashMap::new(),
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
            refused: e.refused.clone(),
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
                refused: None,
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

    /// Remembers `p` under `keyed` if it stored any of its `n` events; then the key record to
    /// write after them when it stored all. One that stopped part-way (a full disk) is
    /// remembered with its refusal, in memory only: a retry gets the same answer (the IDs
    /// stored and the error) instead of storing those events again.
    pub fn remember(
        &mut self,
        stream: &str,
        keyed: Option<Keyed>,
        p: &Published,
        n: usize,
        batch: bool,
        now: Instant,
    ) -> Option<Durable> {
        let k = keyed.filter(|_| !p.ids.is_empty())?;
        self.insert(stream, &k.key, k.hash, (p.ids.clone(), batch), now);
        if p.ids.len() < n {
            let e = self.entries.get_mut(&(stream.to_owned(), k.key.clone()));
            e.expect("just inserted").refused = p.refusal.clone();
            return None;
        }
        durable(&p.ids, k.hash, batch, &k.key)
    }

    /// At start: the key records `recovered` from the logs (stream name, first ID, record),
    /// oldest first, those still within the window at `now` (wall clock `wall_ms`, Unix ms)
    /// remembered as if stored at their record's time. A record that is not ours is skipped.
    pub fn recover(
        &mut self,
        recovered: Vec<(String, EventId, KeyRecord)>,
        now: Instant,
        wall_ms: u64,
    ) -> usize {
        let mut n = 0;
        for (stream, first, rec) in recovered {
            let Some((batch, hash, key)) = parse_record(&rec.key) else {
                continue;
            };
            let age = Duration::from_millis(wall_ms.saturating_sub(rec.timestamp_ms));
            if age >= self.limits.window {
                continue;
            }
            let ids = (0..u64::from(rec.count))
                .map(|i| EventId {
                    seq: first.seq + i,
                    ..first
                })
                .collect();
            let at = now.checked_sub(age).unwrap_or(now);
            self.insert(&stream, key, hash, (ids, batch), at);
            n += 1;
        }
        n
    }

    /// Cluster mode: a message carrying `Gw-Idempotency` was applied as event `id` of
    /// `stream` (every node does this in JetStream order). Its request's IDs gather in order;
    /// the last one makes the key known, and returns the key record to write after it.
    pub fn on_applied(
        &mut self,
        stream: &str,
        header: &str,
        id: EventId,
        now: Instant,
    ) -> Option<Durable> {
        let (batch, hash, i, n, key) = parse_cluster_header(header)?;
        let k = (stream.to_owned(), key.to_owned());
        if i == 0 {
            if self.partial.len() >= self.limits.total_max {
                self.partial.clear(); // requests whose other events never came
            }
            self.partial
                .insert(k.clone(), (hash, Vec::with_capacity(n)));
        }
        let (h, ids) = self.partial.get_mut(&k)?;
        if *h != hash || ids.len() != i {
            self.partial.remove(&k);
            return None;
        }
        ids.push(id);
        if ids.len() < n {
            return None;
        }
        let (_, ids) = self.partial.remove(&k).expect("present");
        let d = durable(&ids, hash, batch, key);
        self.insert(stream, key, hash, (ids, batch), now);
        d
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
        let limits = Limits {
            window: Duration::from_secs(600),
            per_stream_max,
            total_max,
        };
        Keys::new(limits, Default::default())
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
            refused: None,
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

    fn published(ids: Vec<EventId>, refusal: Option<publish::Refusal>) -> Published {
        Published {
            answer: Vec::new(),
            wait: None,
            appended: ids.len(),
            ids,
            refusal,
        }
    }

    #[test]
    fn a_publish_stopped_part_way_replays_its_refusal_and_one_that_stored_nothing_is_new() {
        let mut k = keys(10, 10);
        let t = Instant::now();
        let events = [
            (None, b"a".to_vec()),
            (None, b"b".to_vec()),
            (None, b"c".to_vec()),
        ];
        let keyed = || Some(Keyed::new("k".into(), &events));
        let full = publish::Refusal {
            status: 507,
            code: "insufficient_storage",
            message: "disk full".into(),
        };
        let p = published(vec![id(0, 4), id(0, 5)], Some(full.clone()));
        // Two of three stored: remembered with the refusal, and no key record (in memory only).
        assert_eq!(k.remember("s", keyed(), &p, 3, true, t), None);
        let hash = keyed().unwrap().hash;
        let want = Lookup::Replay {
            ids: vec![id(0, 4), id(0, 5)],
            batch: true,
            refused: Some(full.clone()),
        };
        assert_eq!(k.lookup("s", "k", hash, 0, t), want);
        // Nothing stored: nothing to replay, a retry publishes.
        let p = published(Vec::new(), Some(full));
        assert_eq!(
            k.remember("s", Some(Keyed::new("k2".into(), &events)), &p, 3, true, t),
            None
        );
        assert_eq!(k.lookup("s", "k2", hash, 0, t), Lookup::New);
    }

    /// A real log's hub with stream `s` holding one event appended, not yet durable.
    fn hub_with_one_event(dir: &std::path::Path) -> (Hub, EventId) {
        let opts = log_store::LogOptions {
            segment_bytes: 64 * 1024,
            record_bytes_max: 4096,
            fsync: log_store::FsyncPolicy::Group,
            ..log_store::LogOptions::default()
        };
        let log = log_store::Log::open(dir, opts).unwrap();
        let mut hub = Hub::new(vec![(0, log)], 1);
        let key = hub.open_stream("s").unwrap();
        let m = crate::metrics::CoreMetrics::default();
        let p = hub.append_events(key, &[(None, b"x".to_vec())], (false, false), &m);
        (hub, p.ids[0])
    }

    #[test]
    fn a_replay_waiting_on_a_poisoned_log_gets_its_500_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (mut hub, first) = hub_with_one_event(dir.path());
        let mut k = keys(10, 10);
        let t = Instant::now();
        let events = [(None, b"x".to_vec())];
        let keyed = Keyed::new("k".into(), &events);
        k.insert("s", "k", keyed.hash, (vec![first], false), t);
        // Before the group commit: the replay waits for durability, as the original did.
        let r = k.known(&hub, "s", Some(&keyed), t, false).unwrap();
        assert!(r.wait.is_some(), "held until durable");
        assert!(String::from_utf8_lossy(&r.answer).starts_with("HTTP/1.1 201"));
        // The group commit fails: the log is poisoned and nothing more becomes visible.
        let syncs = hub.start_syncs(t);
        assert_eq!(syncs.len(), 1);
        assert!(matches!(
            syncs[0],
            super::super::hub::SyncOp::File { shard: 0, .. }
        ));
        hub.on_fsync(0, -libc::EIO, 0, t);
        assert!(hub.poisoned(0));
        let r = k.known(&hub, "s", Some(&keyed), t, false).unwrap();
        let answer = String::from_utf8_lossy(&r.answer).into_owned();
        assert!(answer.starts_with("HTTP/1.1 500"), "{answer}");
        assert!(answer.contains("log_failed"), "{answer}");
        assert_eq!(r.wait, None, "nothing would ever release it");
    }

    #[test]
    fn applied_keyed_messages_make_their_key_known_once_all_are_applied() {
        let mut k = keys(10, 10);
        let t = Instant::now();
        let keyed = Keyed::new("k".into(), &[(None, b"a".to_vec()), (None, b"b".to_vec())]);
        let h0 = cluster_header(&keyed, 0, 2, true);
        let h1 = cluster_header(&keyed, 1, 2, true);
        k.on_applied("s", &h0, id(0, 4), t);
        assert_eq!(
            k.lookup("s", "k", keyed.hash, 0, t),
            Lookup::New,
            "one of two"
        );
        k.on_applied("s", &h1, id(0, 5), t);
        let want = Lookup::Replay {
            ids: vec![id(0, 4), id(0, 5)],
            batch: true,
            refused: None,
        };
        assert_eq!(k.lookup("s", "k", keyed.hash, 0, t), want);
        // Out of order or malformed: ignored.
        k.on_applied("s", &cluster_header(&keyed, 1, 2, true), id(0, 6), t);
        for junk in [
            "",
            "x/1/0/1/k",
            "s/zz/0/1/k",
            "s/1/1/1/k",
            "s/1/0/1/a b",
            "s/1/0/1/",
            "s/1/0/18446744073709551615/k",
            "b/1/0/1001/k",
        ] {
            k.on_applied("t", junk, id(1, 1), t);
        }
        assert_eq!(k.len(), 1);
        assert_eq!(cluster_msg_id("s", &keyed, 1), "gw-idem:s:1:k");
    }

    #[test]
    fn only_a_dense_run_of_one_stream_gets_a_key_record() {
        let d = durable(&[id(0, 4), id(0, 5)], 9, true, "k").expect("dense");
        assert_eq!(
            (d.first, d.count, d.bytes),
            (id(0, 4), 2, b"b/0000000000000009/k".to_vec())
        );
        assert_eq!(durable(&[id(0, 4), id(0, 6)], 9, true, "k"), None, "a hole");
        assert_eq!(
            durable(&[id(0, 4), id(1, 5)], 9, true, "k"),
            None,
            "two streams"
        );
        assert_eq!(durable(&[], 9, true, "k"), None);
    }

    #[test]
    fn recovered_key_records_within_the_window_come_back_as_stored() {
        let mut k = keys(10, 10);
        let (t, wall) = (Instant::now(), 1_000_000_000);
        let rec = |stream: u32, count: u32, age_ms: u64, bytes: Vec<u8>| KeyRecord {
            stream: StreamId(stream),
            first: 4,
            count,
            timestamp_ms: wall - age_ms,
            key: bytes,
        };
        let got = vec![
            (
                "s".into(),
                id(0, 4),
                rec(0, 2, 1_000, record_bytes(9, true, "kb")),
            ),
            (
                "s".into(),
                id(0, 4),
                rec(0, 1, 600_000, record_bytes(9, false, "old")),
            ),
            ("t".into(), id(1, 4), rec(1, 1, 0, b"x/zz/k".to_vec())),
            (
                "t".into(),
                id(1, 4),
                rec(1, 1, 0, record_bytes(8, false, "a b")),
            ),
        ];
        assert_eq!(k.recover(got, t, wall), 1, "the junk and the aged skipped");
        let want = Lookup::Replay {
            ids: vec![id(0, 4), id(0, 5)],
            batch: true,
            refused: None,
        };
        assert_eq!(k.lookup("s", "kb", 9, 0, t), want);
        assert_eq!(k.lookup("s", "kb", 8, 0, t), Lookup::Reused);
        assert_eq!(k.lookup("s", "old", 9, 0, t), Lookup::New);
        // Aged from its record's time: gone once the rest of the window has passed.
        let later = t + Duration::from_secs(599);
        assert_eq!(k.lookup("s", "kb", 9, 0, later), Lookup::New);
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
