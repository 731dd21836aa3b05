//! Unit tests of the MCP part without a reactor: requests and actions in, [`Effect`]s out,
//! over a real log in a temporary directory and no upstream started.

use std::sync::Arc;
use std::time::Instant;

use clap::Parser as _;
use log_store::{Log, LogOptions};

use super::cluster_state::ClusterCore;
use super::mcp::{self, Effect, Mcp, McpCx, McpRequest, McpSubscribe};
use crate::config::Config;
use crate::mcp::core::{Action, UpstreamId};
use crate::mcp::credential::Credential;
use crate::metrics::CoreMetrics;
use crate::shards::McpPlace;
use crate::streams::hub::{Hub, SubRef};

/// A core's parts as the MCP part borrows them.
struct Parts {
    _dir: tempfile::TempDir,
    hub: Hub,
    cfg: Config,
    metrics: CoreMetrics,
    now: Instant,
    /// Cluster mode's part (joined to no NATS thread), if the test runs in cluster mode.
    cluster: Option<ClusterCore>,
}

impl Parts {
    fn new() -> Parts {
        Parts::with(LogOptions::default())
    }

    fn with(opts: LogOptions) -> Parts {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::open(dir.path(), opts).expect("open");
        let cfg = Config::parse_from(["gateway", "--upstream-cmd", "true"]);
        Parts {
            _dir: dir,
            hub: Hub::new(vec![(0, log)], 1),
            cfg,
            metrics: CoreMetrics::default(),
            now: Instant::now(),
            cluster: None,
        }
    }

    fn cx(&mut self) -> McpCx<'_> {
        McpCx {
            now: self.now,
            hub: &mut self.hub,
            cluster: self.cluster.as_mut(),
            metrics: &self.metrics,
            cfg: &self.cfg,
            epochs: &[],
        }
    }

    /// The MCP part of a one-shard, one-core node (no upstream is started by these tests).
    fn mcp(&self) -> Mcp {
        let place = McpPlace::new(false, 1, 1);
        assert_eq!(place.shard_of_core(0), Some(0));
        let outside = outside(&self.cfg);
        let sessions = Default::default();
        Mcp::new(
            &self.cfg,
            (0, 0),
            (place, &sessions),
            outside,
            &self.hub,
            self.now,
        )
    }

    /// Every action the MCP core has queued, as effects (what `Core::mcp_apply` carries out).
    fn drain(&mut self, m: &mut Mcp) -> Vec<Effect> {
        let mut out = Vec::new();
        while let Some(a) = m.next_action() {
            out.extend(m.act(a, &mut self.cx()));
        }
        out
    }

    fn request(&mut self, m: &mut Mcp, conn: SubRef, head: &str) -> bool {
        let req = McpRequest {
            conn,
            head: head.as_bytes(),
            body: Vec::new(),
            close: false,
            subject: None,
        };
        m.handle_request(req, 32, &mut self.cx())
    }
}

/// The real upstreams of `cfg` (none is started by these tests) and session IDs.
fn outside(cfg: &Config) -> mcp::McpOutside {
    mcp::McpOutside {
        upstreams: Box::new(mcp::upstreams(cfg, Arc::new(|| {}))),
        session_ids: None,
    }
}

const PUT: &str = "PUT /mcp HTTP/1.1\r\nHost: localhost\r\n\r\n";

#[test]
fn a_request_comes_back_as_one_answer_on_its_connection() {
    let mut p = Parts::new();
    let mut m = p.mcp();
    assert!(p.request(&mut m, (3, 7), PUT), "carried out, not held");
    let effects = p.drain(&mut m);
    let [Effect::Respond { conn, bytes, close }] = effects.as_slice() else {
        panic!("one answer: {effects:?}");
    };
    assert_eq!(
        (*conn, *close),
        ((3, 7), false),
        "on the request's slot and generation"
    );
    let text = String::from_utf8_lossy(bytes);
    assert!(
        text.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
        "{text}"
    );
    assert!(
        !m.conn_closed(p.now, 3),
        "answered: the slot carries no MCP connection any more"
    );
}

#[test]
fn an_answer_for_a_connection_that_closed_first_is_dropped() {
    let mut p = Parts::new();
    let mut m = p.mcp();
    p.request(&mut m, (3, 7), PUT);
    assert!(m.conn_closed(p.now, 3), "the slot carried an MCP request");
    assert!(!m.conn_closed(p.now, 4), "another slot never did");
    assert_eq!(
        p.drain(&mut m),
        vec![],
        "nothing is sent on a closed connection"
    );
}

/// Creates MCP stream `name` with one reader on `reader`; its key.
fn stream_with_reader(p: &mut Parts, name: &str, reader: SubRef) -> crate::streams::StreamKey {
    let sid = p.hub.log_mut(0).create_stream(name).expect("create");
    p.hub.subscribe((0, sid), reader);
    (0, sid)
}

fn open_sse(cid: u64, stream: &str) -> Action {
    Action::OpenSse {
        conn: cid,
        stream: stream.to_owned(),
        from_seq: 1,
        retry_ms: None,
        reprime: None,
        headers: Vec::new(),
        end_after: None,
    }
}

#[test]
fn a_broken_stream_closes_its_readers_and_refuses_to_be_served() {
    let mut p = Parts::new();
    let mut m = p.mcp();
    let (name, reader) = ("mcp/0123abcd/1", (5, 2));
    stream_with_reader(&mut p, name, reader);
    let mut out = Vec::new();
    m.break_stream(name.to_owned(), "disk full".into(), &p.cx(), &mut out);
    assert_eq!(out, vec![Effect::Close(reader)]);
    // A later GET on it gets an explicit 503, not a subscription.
    m.conns.insert(9, (6, 1, false));
    let effects = m.act(open_sse(9, name), &mut p.cx());
    let [Effect::Respond { conn, bytes, .. }] = effects.as_slice() else {
        panic!("one answer: {effects:?}");
    };
    assert_eq!(*conn, (6, 1));
    let text = String::from_utf8_lossy(bytes);
    assert!(text.starts_with("HTTP/1.1 503 "), "{text}");
    assert!(
        !text.contains("0123abcd"),
        "the session ID is not in the answer: {text}"
    );
}

/// Found by the whole-node simulator: a stream the log could not create (a full disk, a
/// poisoned log) was appended to as if it existed, and the core panicked. It is broken from the
/// start: its records are not stored, and its response is an explicit 503.
#[test]
fn a_stream_the_log_cannot_create_is_broken_not_appended_to() {
    let mut p = Parts::new();
    let mut m = p.mcp();
    let name = "mcp/0123abcd/\u{1}".to_owned(); // a control character: refused by the log
    let create = Action::CreateStream {
        stream: name.clone(),
    };
    assert_eq!(m.act(create, &mut p.cx()), vec![]);
    assert!(m.broken.contains_key(&name));
    let record = br#"{"jsonrpc":"2.0","id":1,"result":{}}"#.to_vec();
    assert_eq!(m.act(append(&name, 1, record), &mut p.cx()), vec![]);
    assert_eq!(p.hub.log(0).streams().count(), 0, "nothing stored");
    m.conns.insert(9, (6, 1, false));
    let effects = m.act(open_sse(9, &name), &mut p.cx());
    let [Effect::Respond { bytes, .. }] = effects.as_slice() else {
        panic!("one answer: {effects:?}");
    };
    assert!(bytes.starts_with(b"HTTP/1.1 503 "));
}

/// Found by the whole-node simulator: after the MCP shard's group commit failed, a response
/// waited for ever for records that could no longer become durable (a complete stream's
/// result, appended but not synced, resumed later). Such streams end: their readers are
/// closed, a resume is an explicit 503.
#[test]
fn a_failed_group_commit_ends_the_streams_that_cannot_complete() {
    let mut p = Parts::with(LogOptions {
        fsync: log_store::FsyncPolicy::Group,
        ..LogOptions::default()
    });
    let mut m = p.mcp();
    let (name, reader) = ("mcp/0123abcd/1", (5, 2));
    let (_, sid) = stream_with_reader(&mut p, name, reader);
    let log = p.hub.log_mut(0);
    log.append(sid, None, b"{}").expect("append");
    let b = log.bounds(sid).expect("bounds");
    assert_eq!((b.tail, b.visible_tail), (1, 0), "appended, not durable");
    log.create_stream("mcp/0123abcd/2").expect("create"); // nothing waits on it
    let api = log.create_stream("api-stream").expect("create");
    log.append(api, None, b"x").expect("append"); // not the MCP front's
    assert_eq!(m.log_failed(&p.cx()), vec![Effect::Close(reader)]);
    assert_eq!(m.broken.keys().collect::<Vec<_>>(), vec![name]);
    m.conns.insert(9, (6, 1, false));
    let effects = m.act(open_sse(9, name), &mut p.cx());
    let [Effect::Respond { bytes, .. }] = effects.as_slice() else {
        panic!("one answer: {effects:?}");
    };
    assert!(bytes.starts_with(b"HTTP/1.1 503 "));
}

/// Upstreams that take every line and never answer: the MCP core's requests stay in flight.
#[derive(Debug)]
struct Silent;

impl crate::mcp::upstream::Upstreams for Silent {
    fn children(&self) -> usize {
        0
    }
    fn http_stats(&self) -> Option<crate::mcp::http_upstream::PoolStats> {
        None
    }
    fn spawn(&mut self, _: UpstreamId, _: Option<&str>) -> Result<(), String> {
        Ok(())
    }
    fn send(&mut self, _: UpstreamId, _: Vec<u8>, _: Option<Credential>) -> Result<(), String> {
        Ok(())
    }
    fn set_authorization(&mut self, _: UpstreamId, _: Option<Credential>) {}
    fn kill(&mut self, _: UpstreamId, _: Instant) {}
    fn try_recv(&self) -> Option<crate::mcp::upstream::UpstreamEvent> {
        None
    }
    fn poll(&mut self, _: Instant) -> Vec<(UpstreamId, String)> {
        Vec::new()
    }
    fn stop_all(&mut self) {}
}

/// Found in review: a resume answered 503 because its stream is broken left the MCP core
/// believing the connection attached, so the session never idled out and the stream stayed
/// held. The core is now told the connection is gone.
#[test]
fn a_503_for_a_broken_stream_lets_the_mcp_core_forget_its_connection() {
    let mut p = Parts::new();
    let mut n = 0u8;
    let ids: mcp::SessionIds = Box::new(move || {
        n += 1;
        [n; 16]
    });
    let outside = mcp::McpOutside {
        upstreams: Box::new(Silent),
        session_ids: Some(ids),
    };
    let mut m = Mcp::new(
        &p.cfg,
        (0, 0),
        (McpPlace::new(false, 1, 1), &Default::default()),
        outside,
        &p.hub,
        p.now,
    );
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAccept: application/json, text/event-stream\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        init.len()
    );
    let req = McpRequest {
        conn: (3, 1),
        head: head.as_bytes(),
        body: init.as_bytes().to_vec(),
        close: false,
        subject: None,
    };
    m.handle_request(req, 32, &mut p.cx());
    p.drain(&mut m);
    let log = p.hub.log(0);
    let (sid, name) = (log.streams())
        .find(|(_, name, _)| name.starts_with("mcp/"))
        .map(|(id, name, _)| (id, name.to_owned()))
        .expect("the initialize's stream");
    let session = name
        .split('/')
        .nth(1)
        .expect("mcp/<session>/<n>")
        .to_owned();
    let id = log_store::EventId {
        epoch: log.epoch(),
        stream: sid,
        seq: 1,
    };
    m.broken.insert(name, "a record refused".into());
    let get = format!(
        "GET /mcp HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\
         Mcp-Session-Id: {session}\r\nLast-Event-ID: {id}\r\n\r\n"
    );
    p.request(&mut m, (4, 1), &get);
    let effects = p.drain(&mut m);
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::Respond { conn: (4, 1), bytes, .. }
            if bytes.starts_with(b"HTTP/1.1 503 "))),
        "{effects:?}"
    );
    assert_eq!(m.core.connections_live(), 0, "the MCP core let it go");
}

#[test]
fn an_open_stream_becomes_a_subscription_of_its_connection() {
    let mut p = Parts::new();
    let mut m = p.mcp();
    let name = "mcp/0123abcd/1";
    let key = stream_with_reader(&mut p, name, (5, 2));
    m.conns.insert(9, (6, 1, false));
    let effects = m.act(open_sse(9, name), &mut p.cx());
    let [
        Effect::Subscribe(McpSubscribe {
            conn,
            cid,
            key: k,
            from_seq,
            head,
            ..
        }),
    ] = effects.as_slice()
    else {
        panic!("one subscription: {effects:?}");
    };
    assert_eq!((*conn, *cid, *k, *from_seq), ((6, 1), 9, Some(key), 1));
    assert!(head.starts_with(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"));
}

#[test]
fn a_complete_stream_ends_each_reader_after_its_last_seq() {
    let mut p = Parts::new();
    let mut m = p.mcp();
    let name = "mcp/0123abcd/1";
    let key = stream_with_reader(&mut p, name, (5, 2));
    p.hub.subscribe(key, (8, 1));
    let done = Action::StreamComplete {
        stream: name.to_owned(),
        last_seq: 4,
    };
    let effects = m.act(done, &mut p.cx());
    assert_eq!(
        effects,
        vec![
            Effect::EndAfter {
                conn: (5, 2),
                last_seq: 4
            },
            Effect::EndAfter {
                conn: (8, 1),
                last_seq: 4
            },
        ]
    );
}

fn append(stream: &str, seq: u64, data: Vec<u8>) -> Action {
    Action::Append {
        stream: stream.to_owned(),
        seq,
        event_type: None,
        data,
    }
}

#[test]
fn a_record_the_log_refuses_is_an_error_record_at_its_seq_and_then_the_stream_breaks() {
    let mut p = Parts::with(LogOptions {
        record_bytes_max: 4096,
        ..LogOptions::default()
    });
    let mut m = p.mcp();
    let name = "mcp/0123abcd/1";
    let (_, sid) = stream_with_reader(&mut p, name, (5, 2));
    let big = |id: &str| {
        let pad = "x".repeat(8000);
        format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"pad":"{pad}"}}}}"#).into_bytes()
    };
    // Too large: the JSON-RPC error for the same request stands at seq 1 instead.
    assert_eq!(m.act(append(name, 1, big("7")), &mut p.cx()), vec![]);
    assert_eq!(p.hub.log(0).bounds(sid).map(|b| b.tail), Some(1));
    assert_eq!(m.records_refused, 1);
    // The next record lands at its predicted seq.
    let ok = br#"{"jsonrpc":"2.0","id":8,"result":{}}"#.to_vec();
    assert_eq!(m.act(append(name, 2, ok.clone()), &mut p.cx()), vec![]);
    assert_eq!(p.hub.log(0).bounds(sid).map(|b| b.tail), Some(2));
    // An id too large for even the error record: nothing can stand at seq 3, the stream
    // breaks (its reader is closed) and takes no more records.
    let id = format!("\"{}\"", "i".repeat(8000));
    assert_eq!(
        m.act(append(name, 3, big(&id)), &mut p.cx()),
        vec![Effect::Close((5, 2))]
    );
    assert_eq!(m.act(append(name, 3, ok), &mut p.cx()), vec![]);
    assert_eq!(
        p.hub.log(0).bounds(sid).map(|b| b.tail),
        Some(2),
        "nothing after the break"
    );
    assert_eq!((m.records_refused, m.broken.len()), (2, 1));
}

#[test]
fn every_mcp_metric_family_has_help_and_type() {
    let p = Parts::new();
    let m = p.mcp();
    let mut text = String::new();
    crate::metrics::mcp::render(&mut text, [super::mcp_metrics::figures(&m)].iter());
    let lines: Vec<&str> = text.lines().collect();
    let mut families = 0;
    for (i, l) in lines.iter().enumerate() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            families += 1;
            let name = rest.split(' ').next().expect("a name");
            let help = i.checked_sub(1).map(|j| lines[j]).unwrap_or_default();
            assert!(
                help.starts_with(&format!("# HELP {name} ")),
                "{name}: {help:?}"
            );
        }
    }
    assert!(families >= 14, "{text}");
    assert!(text.contains("gateway_mcp_resumes_total{class=\"ok\"} 0\n"));
}

/// Cluster mode: a `GET` + `Last-Event-ID` of another node's session (replay only: the MCP
/// core ends the stream at this node's tail) waits until this node has applied what
/// JetStream held for the shard when it arrived, not just its `Last-Event-ID`: a node lagging
/// by two records would otherwise replay 1..40 of 42 and end the response there.
#[test]
fn a_replay_only_resume_waits_for_its_read_barrier_or_gets_503() {
    let mut p = Parts::new();
    let (handle, inbox) = cluster::Cluster::detached();
    p.cluster = Some(ClusterCore::new(inbox, handle.clone(), &[]));
    let mut m = Mcp::new(
        &p.cfg,
        (0, 0),
        (McpPlace::new(true, 1, 1), &Default::default()),
        outside(&p.cfg),
        &p.hub,
        p.now,
    );
    m.cluster.as_mut().unwrap().minted = "ffffffff".into();
    // Another node's session: 40 records of its stream applied here (JetStream holds 42).
    let sid = p.hub.log_mut(0).create_stream("mcp/0123abcd/1").unwrap();
    let append = |p: &mut Parts, n: u64| {
        for _ in 0..n {
            p.hub.log_mut(0).append(sid, None, b"{}").unwrap();
        }
        *p.cluster.as_mut().unwrap().applied.entry(0).or_default() += n;
    };
    append(&mut p, 40);
    let id = log_store::EventId {
        epoch: p.hub.log(0).epoch(),
        stream: sid,
        seq: 1,
    };
    let head = format!(
        "GET /mcp HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\
         Mcp-Session-Id: 0123abcd\r\nLast-Event-ID: {id}\r\n\r\n"
    );
    let (a, b) = ((3, 1), (4, 1));
    assert!(
        !p.request(&mut m, a, &head),
        "held though its ID is applied"
    );
    let due = |p: &mut Parts, m: &mut Mcp, deadlines| {
        let (serve, refuse) = m.due_catchups(deadlines, &p.cx());
        let conns = |v: Vec<super::mcp_cluster_state::CatchUp>| v.iter().map(|w| w.conn).collect();
        (conns(serve), conns(refuse))
    };
    let none: (Vec<_>, Vec<_>) = (vec![], vec![]);
    assert_eq!(
        due(&mut p, &mut m, false),
        none,
        "JetStream has not answered"
    );
    let to = (0, &handle);
    m.cluster.as_mut().unwrap().barrier_known(0, Ok(42), to);
    assert_eq!(
        due(&mut p, &mut m, false),
        none,
        "40 of 42 applied: not served"
    );
    append(&mut p, 2);
    assert_eq!(due(&mut p, &mut m, false), (vec![a], vec![]), "42 applied");
    assert!(p.request(&mut m, a, &head), "carried out, not held again");
    // JetStream cannot say (NATS down): 503 at once, never a replay of what is here.
    assert!(!p.request(&mut m, b, &head), "held");
    let mc = m.cluster.as_mut().unwrap();
    mc.barrier_known(1, Err("no stream info".into()), to);
    assert_eq!(due(&mut p, &mut m, false), (vec![], vec![b]));
}

#[test]
fn a_request_head_names_the_shard_of_its_session() {
    let head = |h: &str| format!("GET /mcp HTTP/1.1\r\nHost: x\r\n{h}\r\n").into_bytes();
    let legacy = crate::shards::mcp_legacy_shard(8);
    assert_eq!(
        mcp::session_shard(&head("mcp-session-id: 3-ab\r\n"), 8),
        Some(3)
    );
    assert_eq!(
        mcp::session_shard(&head("Mcp-Session-Id:  7-ab.cd \r\n"), 8),
        Some(7)
    );
    assert_eq!(
        mcp::session_shard(&head("Mcp-Session-Id: abcd\r\n"), 8),
        Some(legacy)
    );
    assert_eq!(
        mcp::session_shard(&head("X-Mcp-Session-Id: 3-ab\r\n"), 8),
        None
    );
    assert_eq!(mcp::session_shard(&head(""), 8), None);
}
