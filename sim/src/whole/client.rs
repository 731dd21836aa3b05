//! The clients of a whole simulated node, speaking HTTP/1.1 and SSE over their end of a
//! socketpair, and the oracle they check against ([`StreamTruth`]).
//!
//! - A [`Publisher`] sends publishes and batches (keep-alive), in pieces of random size, and
//!   reads the answer: a `201` names the IDs its events got; anything else is an explicit
//!   error, and an answer never read (a cut, a crash) leaves the publish unsure.
//! - A [`Subscriber`] subscribes from the start or resumes with its last `Last-Event-ID` (or,
//!   by the seed, an ID beyond the tail, of another epoch, or malformed: each must be refused
//!   with 400), reads a few bytes at a time (slow readers) or many, and is cut at any byte.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::rc::Rc;

use crate::rng::Rng;
use crate::sse::{Item, Parser};

pub type Check = Result<(), String>;

/// What is known of one stream: every event acknowledged or shown, by sequence.
#[derive(Debug, Default)]
pub struct StreamTruth {
    pub name: String,
    /// The data of every event acknowledged or shown.
    pub by_seq: BTreeMap<u64, Vec<u8>>,
    /// Where each payload was seen (payloads are unique).
    at_seq: BTreeMap<Vec<u8>, u64>,
    /// Every payload ever sent to the stream.
    sent: BTreeSet<Vec<u8>>,
    /// Payloads that may be stored twice: sent again with their key after a crash that may
    /// have lost the key's record but not the events (the hole `log-store/DESIGN.md` states).
    may_repeat: BTreeSet<Vec<u8>>,
    pub acked_max: u64,
}

impl StreamTruth {
    pub fn new(name: String) -> StreamTruth {
        StreamTruth {
            name,
            ..StreamTruth::default()
        }
    }

    /// `data` is being sent again after a crash: it may be stored twice.
    pub fn may_repeat(&mut self, data: &[u8]) {
        self.may_repeat.insert(data.to_vec());
    }

    /// `data` is being published.
    pub fn sent_payload(&mut self, data: &[u8]) {
        self.sent.insert(data.to_vec());
    }

    /// `data` is at `seq` (acknowledged or shown): consistent with all known so far?
    pub fn learn(&mut self, seq: u64, data: &[u8], how: &str) -> Check {
        if let Some(d) = self.by_seq.get(&seq) {
            if d != data {
                return Err(format!(
                    "{}: event {seq} {how} as {:?}, known as {:?}",
                    self.name,
                    String::from_utf8_lossy(data),
                    String::from_utf8_lossy(d)
                ));
            }
            return Ok(());
        }
        if !self.sent.contains(data) {
            return Err(format!(
                "{}: event {seq} {how} with data never published: {:?}",
                self.name,
                String::from_utf8_lossy(data)
            ));
        }
        if let Some(&other) = self
            .at_seq
            .get(data)
            .filter(|_| !self.may_repeat.contains(data))
        {
            return Err(format!(
                "{}: payload {:?} at {seq} {how}, already at {other} (stored twice)",
                self.name,
                String::from_utf8_lossy(data)
            ));
        }
        self.by_seq.insert(seq, data.to_vec());
        self.at_seq.insert(data.to_vec(), seq);
        Ok(())
    }

    /// The highest sequence acknowledged or shown.
    pub fn known_max(&self) -> u64 {
        self.by_seq.keys().next_back().copied().unwrap_or(0)
    }
}

/// The client's end of a connection (non-blocking), in the clear or through a TLS session.
#[derive(Debug)]
pub struct ClientConn {
    pub sock: UnixStream,
    /// Bytes for the socket (ciphertext under TLS), from `written` on not sent yet.
    out: Vec<u8>,
    written: usize,
    tls: Option<Box<rustls::ClientConnection>>,
    pub eof: bool,
    /// Bytes read from the socket so far, and whether the client closed it (shared with the
    /// world's check of the node's windows, which outlives the connection).
    pub read_total: Rc<Cell<(u64, bool)>>,
}

impl Drop for ClientConn {
    fn drop(&mut self) {
        let (n, _) = self.read_total.get();
        self.read_total.set((n, true));
    }
}

impl ClientConn {
    pub fn new(fd: OwnedFd, tls: Option<rustls::ClientConnection>) -> ClientConn {
        let sock = UnixStream::from(fd);
        sock.set_nonblocking(true).expect("O_NONBLOCK");
        ClientConn {
            sock,
            out: Vec::new(),
            written: 0,
            tls: tls.map(Box::new),
            eof: false,
            read_total: Rc::new(Cell::new((0, false))),
        }
    }

    /// Queues request bytes (sealed by the session under TLS, once its handshake allows).
    pub fn queue(&mut self, bytes: &[u8]) {
        match &mut self.tls {
            Some(t) => t
                .writer()
                .write_all(bytes)
                .expect("rustls buffers plaintext"),
            None => self.out.extend_from_slice(bytes),
        }
    }

    /// Writes up to `n` bytes of what is queued; whether all are written.
    pub fn write_some(&mut self, n: usize) -> bool {
        if let Some(t) = &mut self.tls {
            while t.wants_write() {
                t.write_tls(&mut self.out).expect("into a vector");
            }
        }
        let end = self.written.saturating_add(n).min(self.out.len());
        if end > self.written {
            match self.sock.write(&self.out[self.written..end]) {
                Ok(k) => self.written += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => self.eof = true,
            }
        }
        self.written == self.out.len()
    }

    /// Reads up to `n` bytes from the socket (none when nothing is there) and returns what
    /// they carry (the plaintext under TLS); sets `eof` at the end. A TLS record the client
    /// cannot open is an error: the node sent bytes that are not its session's.
    pub fn read_some(&mut self, n: usize) -> Result<Vec<u8>, String> {
        let mut buf = vec![0u8; n.max(1)];
        let got = match self.sock.read(&mut buf) {
            Ok(0) => {
                self.eof = true;
                return Ok(Vec::new());
            }
            Ok(k) => k,
            Err(e) => {
                if e.kind() != ErrorKind::WouldBlock {
                    self.eof = true;
                }
                return Ok(Vec::new());
            }
        };
        buf.truncate(got);
        let (n, closed) = self.read_total.get();
        self.read_total.set((n + got as u64, closed));
        let Some(t) = &mut self.tls else {
            return Ok(buf);
        };
        let mut plain = Vec::new();
        let mut rd = &buf[..];
        while !rd.is_empty() {
            t.read_tls(&mut rd).map_err(|e| format!("TLS read: {e}"))?;
            t.process_new_packets()
                .map_err(|e| format!("TLS from the node: {e}"))?;
            match t.reader().read_to_end(&mut plain) {
                Ok(_) => self.eof = true, // close_notify
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => self.eof = true, // closed without close_notify
            }
        }
        Ok(plain)
    }
}

/// The sequence number of an ID `epoch-shard-seq`.
pub fn seq_of(id: &str) -> Option<u64> {
    id.rsplit('-').next()?.parse().ok()
}

/// One publish on its way.
#[derive(Debug, Clone)]
struct Publish {
    stream: usize,
    payloads: Vec<Vec<u8>>,
    /// Its `Idempotency-Key`, if any, and the crashes counted when it was first sent.
    key: Option<(String, u64)>,
    answer: Vec<u8>,
}

/// A publish whose answer was lost (a cut, a crash): it may be sent again with its key.
#[derive(Debug, Clone)]
pub struct Unsure {
    pub stream: usize,
    pub payloads: Vec<Vec<u8>>,
    pub key: Option<(String, u64)>,
}

/// A publisher: one connection at a time, one request in flight.
#[derive(Debug, Default)]
pub struct Publisher {
    pub conn: Option<ClientConn>,
    current: Option<Publish>,
    pub answered: u64,
    /// The last publish whose answer was lost.
    pub unsure: Option<Unsure>,
    /// The last keyed publish answered `201` (sent again, it must be stored once, also across
    /// crashes: its key record was durable with its events before the answer).
    pub answered_keyed: Option<Unsure>,
}

/// What a publisher's step did.
#[derive(Debug)]
pub enum PubOutcome {
    Nothing,
    /// A `201`: these IDs for these payloads, on this stream.
    Stored(usize, Vec<(u64, Vec<u8>)>),
    /// An explicit error (status), with the events it names as stored before it (a batch
    /// stopped part-way: held until those are durable, so they count as acknowledged).
    Refused(u16, usize, Vec<(u64, Vec<u8>)>),
}

impl Publisher {
    pub fn busy(&self) -> bool {
        self.current.is_some()
    }

    /// Starts a publish of `payloads` to stream `stream` named `name` (a batch if more than
    /// one) on `conn` (a fresh connection if the last one closed).
    pub fn start(
        &mut self,
        stream: usize,
        name: &str,
        payloads: Vec<Vec<u8>>,
        key: Option<(String, u64)>,
    ) {
        let conn = self.conn.as_mut().expect("connected");
        let (path, body) = if payloads.len() == 1 {
            (format!("/v1/streams/{name}/events"), payloads[0].clone())
        } else {
            let mut b = Vec::new();
            for p in &payloads {
                b.extend_from_slice(b"{\"data\":\"");
                b.extend_from_slice(p);
                b.extend_from_slice(b"\"}\n");
            }
            (format!("/v1/streams/{name}/events:batch"), b)
        };
        let key_header = key
            .as_ref()
            .map_or(String::new(), |(k, _)| format!("Idempotency-Key: {k}\r\n"));
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: sim\r\n{key_header}Content-Length: {}\r\n\r\n",
            body.len()
        );
        conn.queue(head.as_bytes());
        conn.queue(&body);
        self.current = Some(Publish {
            stream,
            payloads,
            key,
            answer: Vec::new(),
        });
    }

    /// Writes up to `w` bytes and reads up to `r`; the answer once it is whole.
    pub fn advance(&mut self, w: usize, r: usize) -> Result<PubOutcome, String> {
        let (Some(conn), Some(p)) = (self.conn.as_mut(), self.current.as_mut()) else {
            return Ok(PubOutcome::Nothing);
        };
        conn.write_some(w);
        let got = conn.read_some(r)?;
        p.answer.extend_from_slice(&got);
        let Some((status, body)) = whole_answer(&p.answer)? else {
            if conn.eof {
                self.cut(); // cut before the answer: unsure
            }
            return Ok(PubOutcome::Nothing);
        };
        let p = self.current.take().expect("a publish in flight");
        self.answered += 1;
        if status != 201 {
            self.conn = None; // an error may close the connection: start afresh
            let stored = match body.split_once("\"appended_ids\":") {
                Some((_, rest)) => ids_of(&format!("\"ids\":{rest}"))?,
                None => Vec::new(),
            };
            if stored.len() > p.payloads.len() {
                return Err(format!(
                    "{status} naming more events stored than sent: {body}"
                ));
            }
            let stored = stored.into_iter().zip(p.payloads).collect();
            return Ok(PubOutcome::Refused(status, p.stream, stored));
        }
        let ids = ids_of(&body)?;
        if p.key.is_some() {
            self.answered_keyed = Some(Unsure {
                stream: p.stream,
                payloads: p.payloads.clone(),
                key: p.key.clone(),
            });
        }
        if ids.len() != p.payloads.len() {
            return Err(format!(
                "201 with {} IDs for {} events: {body}",
                ids.len(),
                p.payloads.len()
            ));
        }
        Ok(PubOutcome::Stored(
            p.stream,
            ids.into_iter().zip(p.payloads).collect(),
        ))
    }

    /// A cut: the connection closes wherever it was (the publish in flight is unsure).
    pub fn cut(&mut self) {
        self.conn = None;
        if let Some(p) = self.current.take() {
            self.unsure = Some(Unsure {
                stream: p.stream,
                payloads: p.payloads,
                key: p.key,
            });
        }
    }
}

/// The status and body of a whole answer in `b`, if it is all there.
pub(super) fn whole_answer(b: &[u8]) -> Result<Option<(u16, String)>, String> {
    let Some(end) = b.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&b[..end]);
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {head:?}"))?;
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .ok_or_else(|| format!("an answer without Content-Length: {head:?}"))?;
    let body = &b[end + 4..];
    if body.len() < len {
        return Ok(None);
    }
    if body.len() > len {
        return Err(format!(
            "bytes after the answer: {:?}",
            String::from_utf8_lossy(b)
        ));
    }
    Ok(Some((status, String::from_utf8_lossy(body).into_owned())))
}

/// The sequences of the IDs in a `201`'s body (`{"id":..}` or `{"ids":[..]}`).
fn ids_of(body: &str) -> Result<Vec<u64>, String> {
    let inner = body
        .split_once("\"id\":")
        .or_else(|| body.split_once("\"ids\":"))
        .ok_or_else(|| format!("a 201 without IDs: {body}"))?
        .1;
    inner
        .split('"')
        .skip(1)
        .step_by(2)
        .take_while(|s| seq_of(s).is_some())
        .map(|s| seq_of(s).ok_or_else(|| format!("bad ID {s:?}")))
        .collect()
}

/// How a subscriber asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// From the start, or after its last event: 200 and exactly the suffix.
    Suffix,
    /// An ID the node must refuse with 400 (beyond the tail, another epoch, malformed).
    Refused(String),
}

/// A subscriber of one stream.
#[derive(Debug)]
pub struct Subscriber {
    pub stream: usize,
    pub conn: Option<ClientConn>,
    parser: Parser,
    /// The last event observed: its ID and sequence.
    pub last: Option<(String, u64)>,
    ask: Ask,
    pub status: Option<u16>,
    /// Reads a few bytes at a time.
    pub slow: bool,
    /// Retention is on: a fresh subscription starts at the floor, whatever it is, and a resume
    /// may be answered 410.
    retention: bool,
    /// The last resume was answered 410 (to be checked against the log's floor).
    pub gone: bool,
}

impl Subscriber {
    pub fn new(stream: usize, slow: bool, retention: bool) -> Subscriber {
        Subscriber {
            stream,
            conn: None,
            parser: Parser::default(),
            last: None,
            ask: Ask::Suffix,
            status: None,
            slow,
            retention,
            gone: false,
        }
    }

    /// Subscribes on `conn`: after its last event, or with `odd` (an ID to be refused).
    pub fn connect(&mut self, mut conn: ClientConn, name: &str, odd: Option<String>) {
        let id = odd
            .clone()
            .or_else(|| self.last.as_ref().map(|l| l.0.clone()));
        let (query, header) = match id {
            Some(id) => (String::new(), format!("Last-Event-ID: {id}\r\n")),
            None => ("?from=earliest".to_owned(), String::new()),
        };
        let req = format!(
            "GET /v1/streams/{name}{query} HTTP/1.1\r\nHost: sim\r\nAccept: text/event-stream\r\n{header}\r\n"
        );
        conn.queue(req.as_bytes());
        self.conn = Some(conn);
        self.parser = Parser::default();
        self.status = None;
        self.ask = odd.map_or(Ask::Suffix, Ask::Refused);
    }

    /// Reads up to `n` bytes and checks every item against `truth`; how many events.
    pub fn advance(&mut self, n: usize, truth: &mut StreamTruth) -> Result<u64, String> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(0);
        };
        conn.write_some(usize::MAX);
        let got = conn.read_some(n)?;
        let eof = conn.eof;
        self.parser.feed(&got);
        let mut events = 0;
        while let Some(item) = self.parser.poll_item()? {
            events += u64::from(self.on_item(item, truth)?);
            if self.conn.is_none() {
                return Ok(events);
            }
        }
        if eof {
            self.conn = None;
        }
        Ok(events)
    }

    fn on_item(&mut self, item: Item, truth: &mut StreamTruth) -> Result<bool, String> {
        match (item, &self.ask) {
            (Item::Head { status: 410 }, Ask::Suffix) if self.retention && self.last.is_some() => {
                self.gone = true; // checked against the floor by the world
                self.conn = None;
            }
            (Item::Head { status }, Ask::Suffix) => {
                if status != 200 {
                    return Err(format!(
                        "{}: a resume after {:?} answered {status}",
                        truth.name, self.last
                    ));
                }
                self.status = Some(status);
            }
            (Item::Head { status }, Ask::Refused(id)) => {
                if status != 400 {
                    return Err(format!(
                        "{}: ID {id:?} answered {status}, not 400",
                        truth.name
                    ));
                }
                self.conn = None; // refused: done with this connection
            }
            (Item::Event { id, data, .. }, Ask::Suffix) => {
                let seq = seq_of(&id).ok_or_else(|| format!("bad event ID {id:?}"))?;
                // From the start: event 1, or with retention the floor (checked by the world).
                let want = match &self.last {
                    Some(l) => l.1 + 1,
                    None if self.retention => seq,
                    None => 1,
                };
                if seq != want {
                    return Err(format!(
                        "{}: event {seq} after {:?} (expected {want}: {})",
                        truth.name,
                        self.last,
                        if seq > want { "a gap" } else { "a repeat" }
                    ));
                }
                truth.learn(seq, &data, "shown")?;
                self.last = Some((id, seq));
                return Ok(true);
            }
            (Item::Truncated { .. }, Ask::Suffix) => {
                // An explicit end (the subscriber lagged): it resumes from its last event.
                self.conn = None;
            }
            (Item::Other, _) => {}
            (item, Ask::Refused(id)) => {
                return Err(format!(
                    "{}: {item:?} after the refused ID {id:?}",
                    truth.name
                ));
            }
        }
        Ok(false)
    }

    /// A cut at any byte.
    pub fn cut(&mut self) {
        self.conn = None;
    }

    /// An ID the node must refuse: beyond `tail`, of another epoch, or malformed.
    pub fn odd_id(rng: &mut Rng, epoch_id: Option<&str>, tail: u64) -> String {
        let prefix = epoch_id
            .and_then(|id| id.rsplit_once('-'))
            .map_or("0123456789abcdef-0", |(p, _)| p)
            .to_owned();
        match rng.below(3) {
            0 => format!("{prefix}-{}", tail + 1_000_000),
            1 => "00000000000000ff-0-1".to_owned(),
            _ => "not-an-id".to_owned(),
        }
    }
}
