//! The MCP front's cluster-mode state (`McpCluster`): each MCP stream's order of records in
//! flight and queued, the tickets, the held resumes (`CatchUp`) and their read barriers, and
//! the error records that stand in for a record that cannot be stored in its place. The
//! behaviour over it, as `Mcp` methods, is `mcp_cluster.rs` (its module text says how MCP works
//! in cluster mode).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use log_store::{EventId, Seq};

use crate::mcp::jsonrpc;
use crate::streams::SubRef;
use crate::streams::publish::RecordLimit;

/// One MCP record waiting for its turn.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) seq: Seq,
    pub(super) event_type: Option<&'static str>,
    pub(super) data: Vec<u8>,
}

/// An MCP stream's messages on their way through JetStream.
#[derive(Debug, Default)]
pub(super) struct Order {
    /// The messages in flight, in the order they were sent: ticket and predicted seq (at
    /// most `--cluster-mcp-inflight-max`).
    pub(super) inflight: VecDeque<(u64, Seq)>,
    pub(super) queued: VecDeque<Queued>,
}

impl Order {
    /// Whether a new record may be sent now (else it queues: order is kept).
    pub(super) fn may_send(&self, window: usize) -> bool {
        self.inflight.len() < window && self.queued.is_empty()
    }

    /// One of this stream's tickets came back (`Ok(seq)`: applied at `seq`). It must be the
    /// oldest in flight and carry the predicted seq; the popped oldest ticket is returned
    /// either way (the caller forgets it), with the reason the stream must break, if any.
    pub(super) fn done(
        &mut self,
        ticket: u64,
        outcome: Result<Seq, &str>,
    ) -> (u64, Option<String>) {
        let (oldest, predicted) = self.inflight.pop_front().expect("the ticket in flight");
        let why = match outcome {
            Err(why) => Some(format!("JetStream did not confirm a record: {why}")),
            Ok(_) if oldest != ticket => Some(
                "JetStream stored the stream's records out of the order they were sent (a \
                 record was sent again after a failure)"
                    .to_owned(),
            ),
            Ok(seq) if seq != predicted => Some(format!(
                "the MCP core predicted seq {predicted}, JetStream's order gave {seq} (a record \
                 went missing, or another node wrote to this session's stream)"
            )),
            Ok(_) => None,
        };
        (oldest, why)
    }

    /// The next queued record the window lets go.
    pub(super) fn next(&mut self, window: usize) -> Option<Queued> {
        (self.inflight.len() < window)
            .then(|| self.queued.pop_front())
            .flatten()
    }
}

/// What a held resume waits for besides its `Last-Event-ID`: a replay-only resume (of a
/// session this process did not mint) is read by the MCP core as ending at this node's tail,
/// so it is served only once this node has applied every message JetStream held for the
/// shard when the resume arrived (a node lagging by a few records would otherwise end the
/// stream short: a silent partial replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Barrier {
    /// None needed: this node's own session (`completing` covers its stream's end).
    Unneeded,
    /// JetStream's last sequence of the shard was asked for under this token.
    Asked(u64),
    /// Served once the shard's applied message count reaches this.
    At(u64),
    /// JetStream could not say (NATS down, a timeout): refused at once (503).
    Failed,
}

/// What becomes of a held resume now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// Carried out: its `Last-Event-ID` and its barrier are applied here.
    Serve,
    /// 503 with `Retry-After`: its barrier failed, or (`deadlines`) its deadline passed.
    Refuse,
    Wait,
}

/// The decision for one held resume: `id_applied` (the log holds its `Last-Event-ID` and a
/// completing stream's end), its barrier, the shard's applied message count.
pub(super) fn due(id_applied: bool, barrier: Barrier, shard_applied: u64, expired: bool) -> Due {
    let barrier_met = match barrier {
        Barrier::Unneeded => true,
        Barrier::Asked(_) | Barrier::Failed => false,
        Barrier::At(last) => shard_applied >= last,
    };
    match (id_applied && barrier_met, barrier, expired) {
        (true, _, _) => Due::Serve,
        (false, Barrier::Failed, _) | (false, _, true) => Due::Refuse,
        (false, _, false) => Due::Wait,
    }
}

/// A `GET` + `Last-Event-ID` this node has not applied yet (or that waits for its read
/// barrier), held until it has.
pub(super) struct CatchUp {
    pub(super) conn: SubRef,
    pub(super) id: EventId,
    pub(super) head: Vec<u8>,
    pub(super) body: Vec<u8>,
    pub(super) close: bool,
    pub(super) subject: Option<String>,
    pub(super) deadline: Instant,
    pub(super) barrier: Barrier,
}

/// The MCP core's cluster state (`Debug` prints counts: its maps hold session IDs).
pub(super) struct McpCluster {
    /// The hex prefix of every session ID this process mints (4 random bytes per process).
    pub(super) minted: String,
    pub(super) streams: HashMap<String, Order>,
    /// In-flight ticket → its stream.
    pub(super) tickets: HashMap<u64, String>,
    /// Bytes of queued (not yet sent) records (`--cluster-mcp-queue-bytes-max`).
    pub(super) queued_bytes: usize,
    pub(super) catchup: Vec<CatchUp>,
    /// Complete streams with records still on their way: stream → its last seq.
    pub(super) completing: HashMap<String, Seq>,
    /// The read barrier request in flight (its token), and the next token
    /// ([`McpCluster::barrier_token`]).
    pub(super) asked: Option<u64>,
    pub(super) next_barrier: u64,
    /// Held resumes just found due: carried out without being held again.
    pub(super) passed: Vec<SubRef>,
}

/// The record every node stores instead of an MCP record that JetStream's order put at
/// `got` while its publisher predicted `expected`: the JSON-RPC error for the same request
/// (or an `event: error` record), as for a record the log refused; a fixed `event: error`
/// record if even that would not fit `record_max`. A function of the message and the log, so
/// every node stores the same bytes.
pub(super) fn seq_mismatch_record(
    data: &[u8],
    expected: Seq,
    got: Seq,
    limit: RecordLimit,
) -> (Option<&'static str>, Vec<u8>) {
    let why = format!(
        "its publisher expected seq {expected}, JetStream's order gave {got} (a record before \
         it was lost, or it overtook one): the stream is broken from here"
    );
    mcp_substitute(data, &why, limit)
}

/// The record that takes an MCP record's place in its stream (`why` it could not be stored):
/// the MCP front's substitute, or a bare error record if that would not fit the log.
pub(super) fn mcp_substitute(
    data: &[u8],
    why: &str,
    limit: RecordLimit,
) -> (Option<&'static str>, Vec<u8>) {
    let (t, d) = jsonrpc::not_stored_substitute(data, why);
    if limit.overflow_any_id(t, &d).is_none() {
        return (t, d);
    }
    let body = serde_json::json!({ "error": why, "code": jsonrpc::NOT_STORED });
    (Some("error"), body.to_string().into_bytes())
}

impl McpCluster {
    pub(super) fn new(minted: String) -> McpCluster {
        McpCluster {
            minted,
            streams: HashMap::new(),
            tickets: HashMap::new(),
            queued_bytes: 0,
            catchup: Vec::new(),
            completing: HashMap::new(),
            asked: None,
            next_barrier: 0,
            passed: Vec::new(),
        }
    }
}

impl std::fmt::Debug for McpCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpCluster")
            .field("streams", &self.streams.len())
            .field("queued_bytes", &self.queued_bytes)
            .field("catchup", &self.catchup.len())
            .finish_non_exhaustive()
    }
}

impl McpCluster {
    /// The read barrier of a resume that arrives now: the token of a JetStream request sent
    /// after it. At most one request is in flight per MCP shard (a flood of resumes is not
    /// a flood of JetStream requests): a resume arriving meanwhile takes the next token,
    /// asked when the one in flight is answered (an answer to a request sent before the
    /// resume arrived could miss records stored in between).
    pub(super) fn barrier_token(&mut self, shard: u32, handle: &cluster::Cluster) -> u64 {
        if self.asked.is_some() {
            return self.next_barrier;
        }
        let token = self.next_barrier;
        self.next_barrier += 1;
        self.asked = Some(token);
        handle.last_seq(shard, token);
        token
    }

    /// JetStream answered read barrier `token`: every resume waiting for it learns its
    /// barrier (the ones that went away meanwhile are gone); the next request goes out if
    /// resumes wait for it.
    pub(super) fn barrier_known(
        &mut self,
        token: u64,
        last: Result<u64, String>,
        (shard, handle): (u32, &cluster::Cluster),
    ) {
        let barrier = match &last {
            Ok(last) => Barrier::At(*last),
            Err(_) => Barrier::Failed,
        };
        let waiting = self.catchup.iter_mut();
        let mut told = 0;
        for w in waiting.filter(|w| w.barrier == Barrier::Asked(token)) {
            w.barrier = barrier;
            told += 1;
        }
        if let (Err(why), 1..) = (&last, told) {
            crate::warn_limited!(reason = %why, resumes = told, "MCP resumes refused: no read barrier");
        }
        if self.asked == Some(token) {
            self.asked = None;
            let next = Barrier::Asked(self.next_barrier);
            if self.catchup.iter().any(|w| w.barrier == next) {
                self.barrier_token(shard, handle);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::{Barrier, CatchUp, Due, McpCluster, Order, Queued, due};
    use crate::streams::publish::RecordLimit;

    /// Every held resume's case: served only once its `Last-Event-ID` is applied and, for a
    /// replay-only one, the shard's applied count has reached JetStream's last sequence as it
    /// was when the resume arrived (never before: a short replay); refused when the barrier
    /// failed or the deadline passed; else it waits.
    #[test]
    fn a_replay_only_resume_is_served_only_past_its_read_barrier() {
        let barriers = [
            Barrier::Unneeded,
            Barrier::Asked(0),
            Barrier::At(5),
            Barrier::Failed,
        ];
        for id_applied in [false, true] {
            for barrier in barriers {
                for shard_applied in [0, 4, 5, 6] {
                    for expired in [false, true] {
                        let met = match barrier {
                            Barrier::Unneeded => true,
                            Barrier::At(last) => shard_applied >= last,
                            Barrier::Asked(_) | Barrier::Failed => false,
                        };
                        let want = if id_applied && met {
                            Due::Serve
                        } else if expired || barrier == Barrier::Failed {
                            Due::Refuse
                        } else {
                            Due::Wait
                        };
                        let case = (id_applied, barrier, shard_applied, expired);
                        assert_eq!(
                            due(id_applied, barrier, shard_applied, expired),
                            want,
                            "{case:?}"
                        );
                    }
                }
            }
        }
        // The bug this prevents: the node holds the ID (1..40 of 42 applied) but not the
        // rest JetStream held: the resume waits instead of ending the stream at 40.
        assert_eq!(due(true, Barrier::At(42), 40, false), Due::Wait);
        assert_eq!(due(true, Barrier::At(42), 40, true), Due::Refuse);
        assert_eq!(due(true, Barrier::At(42), 42, false), Due::Serve);
    }

    #[test]
    fn one_barrier_request_at_a_time_and_each_answer_reaches_its_resumes() {
        let held = |token| CatchUp {
            conn: (1, token as u32),
            id: log_store::EventId {
                epoch: log_store::Epoch(1),
                stream: log_store::StreamId(0),
                seq: 1,
            },
            head: Vec::new(),
            body: Vec::new(),
            close: false,
            subject: None,
            deadline: Instant::now(),
            barrier: Barrier::Asked(token),
        };
        let (handle, _inbox) = cluster::Cluster::detached();
        let mut mc = McpCluster::new("00000000".into());
        // One request in flight: resumes arriving meanwhile wait for the next one.
        assert_eq!(mc.barrier_token(0, &handle), 0);
        assert_eq!(mc.barrier_token(0, &handle), 1);
        assert_eq!(mc.barrier_token(0, &handle), 1);
        mc.catchup.extend([held(0), held(1), held(1)]);
        mc.barrier_known(7, Ok(3), (0, &handle)); // no resume waits for it: nothing changes
        mc.barrier_known(0, Ok(42), (0, &handle));
        assert_eq!(
            mc.asked,
            Some(1),
            "the next one is asked for the two waiting"
        );
        mc.barrier_known(1, Err("NATS down".into()), (0, &handle));
        let got: Vec<Barrier> = mc.catchup.iter().map(|w| w.barrier).collect();
        assert_eq!(got, [Barrier::At(42), Barrier::Failed, Barrier::Failed]);
        assert_eq!(mc.asked, None, "none waits: nothing asked");
    }

    fn queued(seq: u64) -> Queued {
        Queued {
            seq,
            event_type: None,
            data: vec![b'x'],
        }
    }

    fn limit(record_bytes_max: usize) -> RecordLimit {
        RecordLimit { record_bytes_max }
    }

    #[test]
    fn a_mispredicted_record_becomes_an_explicit_error_that_always_fits() {
        let resp = br#"{"jsonrpc":"2.0","id":7,"result":{}}"#;
        let (t, d) = super::seq_mismatch_record(resp, 5, 4, limit(135_168));
        let v: serde_json::Value = serde_json::from_slice(&d).unwrap();
        assert_eq!(
            (t, v["id"].clone()),
            (None, 7.into()),
            "an error for the same request"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("expected seq 5")
        );
        // A response whose id alone is over the limit: the fixed record.
        let huge = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","result":{{}}}}"#,
            "x".repeat(300)
        );
        let (t, d) = super::seq_mismatch_record(huge.as_bytes(), 5, 4, limit(256));
        assert_eq!(t, Some("error"));
        assert!(d.len() < 256 && !String::from_utf8(d).unwrap().contains("xxx"));
    }

    #[test]
    fn a_stream_sends_within_its_window_in_order_and_breaks_on_any_disorder() {
        let mut o = Order::default();
        // Window 2: two go, the third queues.
        assert!(o.may_send(2));
        o.inflight.push_back((10, 1));
        o.inflight.push_back((11, 2));
        assert!(!o.may_send(2));
        o.queued.push_back(queued(3));
        assert!(o.next(2).is_none(), "the window is full");
        // In order, at the predicted seq: fine; the queued one may go.
        assert_eq!(o.done(10, Ok(1)), (10, None));
        assert_eq!(o.next(2).map(|q| q.seq), Some(3));
        o.inflight.push_back((12, 3));
        assert!(!o.may_send(2));
        // Out of order (12 before 11): break, and 11 (the oldest) is handed back to forget.
        let mut a = Order::default();
        a.inflight.extend([(11, 2), (12, 3)]);
        let (oldest, why) = a.done(12, Ok(2));
        assert_eq!(oldest, 11);
        assert!(why.unwrap().contains("out of the order"));
        // Another seq than predicted (a record lost before it, or another writer): break.
        let mut b = Order::default();
        b.inflight.push_back((11, 2));
        assert!(b.done(11, Ok(3)).1.unwrap().contains("predicted seq 2"));
        // Unconfirmed: break.
        let mut c = Order::default();
        c.inflight.push_back((11, 2));
        assert!(c.done(11, Err("timeout")).1.unwrap().contains("timeout"));
        // A queued record never overtakes: nothing is sent while one waits.
        let mut d = Order::default();
        d.queued.push_back(queued(5));
        assert!(!d.may_send(16));
    }
}
