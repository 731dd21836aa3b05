//! `confirm` against a real `nats-server` (JetStream; shard 0's stream as `Thread::start`
//! creates it: `allow_atomic`, a 2-minute duplicate window; messages as `Thread::msg` builds
//! them). A publish is stored by an attempt whose answer is then taken as lost, and `confirm`
//! sends it again with the same `Nats-Msg-Id`s, as `publish` and `publish_batch` do: an atomic
//! batch's resend (a new batch ID) is refused with error 10201, a single message's gets a
//! duplicate acknowledgement. Unkeyed, both are read as stored (the stream still holds each
//! message once); keyed, as "already holds" (the gateway's 503 `publish_unconfirmed`). The
//! server's answers are asserted as well, so a server that answers otherwise fails here.
//!
//! And the follower (`follow_from`): on paused time without a server, when its wait for a
//! message reports the consumer stuck; against the server, that a consumer async-nats
//! recreates from the stream's first message is dropped and asked again from the next one.
//!
//! Needs `nats-server` >= 2.12 at $NATS_SERVER (`bash scripts/setup-cluster.sh` prints it);
//! when that is unset the tests print SKIPPED and pass. One server per test, on a loopback
//! port it picks itself (no race for a free port), its store in a temporary directory; the
//! server is killed and the directory removed when the test ends, passed or failed.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use super::*;
use crate::{Keyed, Publish};

/// A batch's events.
const EVENTS: u64 = 5;
/// Bounds `confirm` (it needs one resend, 100 ms after the lost answer).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// Bounds the server's start and the client's connection.
const START_WAIT: Duration = Duration::from_secs(20);
/// What `confirm` is handed for attempt 0, whose answer the test took.
const LOST: &str = "attempt 0's answer was lost";

/// A `nats-server` with JetStream on 127.0.0.1; killed, and its directory removed, on drop.
struct Server {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Server {
    /// Starts `$NATS_SERVER`; `None` (SKIPPED printed) when the variable is unset.
    fn start() -> Option<Server> {
        let Some(bin) = std::env::var_os("NATS_SERVER") else {
            eprintln!(
                "SKIPPED: JetStream duplicate tests: NATS_SERVER is unset (`bash \
                 scripts/setup-cluster.sh` installs nats-server and prints it)"
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        // Port -1: the server takes a free port itself and names it in its ports file.
        let child = Command::new(&bin)
            .args(["-a", "127.0.0.1", "-p", "-1", "-js", "-sd"])
            .arg(dir.path().join("js"))
            .arg("--ports_file_dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin:?}: {e}"));
        let mut server = Server {
            child,
            url: String::new(),
            dir,
        };
        server.url = server.wait_url();
        Some(server)
    }

    /// The client URL from the server's ports file, once written (within `START_WAIT`).
    fn wait_url(&mut self) -> String {
        let deadline = Instant::now() + START_WAIT;
        loop {
            if let Some(url) = ports_file_url(self.dir.path()) {
                return url;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("nats-server ended ({status}); its log:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "nats-server wrote no ports file within {START_WAIT:?}; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The URL in `<dir>/<executable>_<pid>.ports` (`{"nats":["nats://127.0.0.1:<port>"]}`);
/// `None` while it is absent or partly written.
fn ports_file_url(dir: &Path) -> Option<String> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        if entry.file_name().to_string_lossy().ends_with(".ports") {
            let text = std::fs::read(entry.path()).ok()?;
            let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
            return v["nats"][0].as_str().map(str::to_owned);
        }
    }
    None
}

/// A server, and the `nats` thread's state as `spawn` makes it against that server (shard 0's
/// stream created), without the thread: the test drives its parts. `None`: skipped.
async fn start() -> Option<(Server, Thread)> {
    let server = Server::start()?;
    let cfg = Config {
        urls: vec![server.url.clone()],
        replicas: 1,
        shards: 1,
        connect_timeout: START_WAIT,
        publish_timeout: PUBLISH_TIMEOUT,
        inbox_messages_max: 16,
        stream_messages_max: 0,
        stream_bytes_max: 0,
        snapshot_chunk_bytes: 1 << 20,
    };
    let (tx, _) = mpsc::channel(16);
    let out = Out {
        tx,
        armed: Arc::new(AtomicBool::new(false)),
        wake: Arc::new(|| {}),
    };
    let (t, shards) = Thread::start(cfg, vec![0], vec![out], "test".into())
        .await
        .unwrap();
    assert_eq!(shards.len(), 1);
    Some((server, t))
}

/// `n` events of stream `dup`, tickets 1..=n, keyed (one request's key) or not.
fn publishes(keyed: bool, n: u64) -> Vec<Publish> {
    (1..=n)
        .map(|ticket| {
            let i = ticket - 1;
            Publish {
                shard: 0,
                ticket,
                stream: "dup".into(),
                event: None,
                data: format!("event {ticket}").into_bytes(),
                expect_seq: None,
                keyed: keyed.then(|| Keyed {
                    msg_id: format!("gw-idem:dup:{i}:key-1"),
                    header: format!("b/0123abcd/{i}/{n}/key-1"),
                }),
            }
        })
        .collect()
}

/// The messages shard 0's stream holds.
async fn messages_held(t: &Thread) -> u64 {
    t.streams[&0].get_info().await.unwrap().state.messages
}

/// Commits `EVENTS` publishes as one atomic batch (attempt 0, its answer taken here), then
/// runs `confirm` as `publish_batch` does once that answer is lost: its first resend
/// (attempt 1: a new batch ID, the same `Nats-Msg-Id`s) must settle it. Asserts that
/// JetStream refuses such a resend with 10201 (attempt 2, answered here) and holds every
/// message once; returns what `confirm` said.
async fn batch_after_a_lost_answer(t: &Thread, keyed: bool) -> Result<(), String> {
    let b = Batch {
        id: names::msg_id(&t.nonce, 1),
        msgs: publishes(keyed, EVENTS)
            .into_iter()
            .map(|p| t.msg(p))
            .collect(),
    };
    let ack = batch::send(&t.js, &b, 0).await.unwrap().await;
    let ack = ack.expect("attempt 0 is committed");
    let committed = (ack.duplicate, ack.batch_size, ack.sequence);
    assert_eq!(committed, (false, Some(EVENTS), EVENTS), "{ack:?}");
    let mut attempts = Vec::new();
    let resend = |attempt| {
        attempts.push(attempt);
        batch::send(&t.js, &b, attempt)
    };
    let outcome = confirm(Err(LOST.into()), PUBLISH_TIMEOUT, b.keyed(), resend).await;
    assert_eq!(attempts, [1], "one resend settles it");
    let refused = batch::send(&t.js, &b, 2).await.unwrap().await;
    let refused = refused.expect_err("JetStream refuses a resend of a committed batch");
    assert_eq!(
        error_code(&refused),
        Some(BATCH_DUPLICATE_MSG_ID),
        "{refused}"
    );
    assert_eq!(messages_held(t).await, EVENTS, "nothing stored twice");
    outcome
}

/// One publish stored (attempt 0, its answer taken here), then `confirm` as `publish` runs it
/// once that answer is lost: its first resend (the same `Nats-Msg-Id`) must settle it.
/// Asserts that JetStream acknowledges such a resend as a duplicate of the stored message
/// (answered here) and holds it once; returns what `confirm` said.
async fn single_after_a_lost_answer(t: &Thread, keyed: bool) -> Result<(), String> {
    let m = t.msg(publishes(keyed, 1).remove(0));
    let ack = crate::msg::send(&t.js, &m).await.unwrap().await;
    let ack = ack.expect("attempt 0 is stored");
    assert_eq!((ack.duplicate, ack.sequence), (false, 1), "{ack:?}");
    let mut attempts = Vec::new();
    let resend = |attempt| {
        attempts.push(attempt);
        crate::msg::send(&t.js, &m)
    };
    let outcome = confirm(Err(LOST.into()), PUBLISH_TIMEOUT, m.keyed.is_some(), resend).await;
    assert_eq!(attempts, [1], "one resend settles it");
    let again = crate::msg::send(&t.js, &m).await.unwrap().await;
    let again = again.expect("JetStream acknowledges a resend of a stored message");
    assert_eq!((again.duplicate, again.sequence), (true, 1), "{again:?}");
    assert_eq!(messages_held(t).await, 1, "nothing stored twice");
    outcome
}

fn assert_already_held(outcome: Result<(), String>) {
    let held = "JetStream already holds a publish with this Idempotency-Key";
    assert!(
        outcome.as_ref().is_err_and(|e| e.starts_with(held)),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn an_unkeyed_batch_resent_after_its_commit_is_refused_with_10201_and_read_as_stored() {
    let Some((_server, t)) = start().await else {
        return;
    };
    assert_eq!(batch_after_a_lost_answer(&t, false).await, Ok(()));
}

#[tokio::test]
async fn a_keyed_batch_resent_after_its_commit_is_refused_with_10201_and_read_as_held_already() {
    let Some((_server, t)) = start().await else {
        return;
    };
    assert_already_held(batch_after_a_lost_answer(&t, true).await);
}

#[tokio::test]
async fn an_unkeyed_publish_resent_after_it_was_stored_is_a_duplicate_read_as_stored() {
    let Some((_server, t)) = start().await else {
        return;
    };
    assert_eq!(single_after_a_lost_answer(&t, false).await, Ok(()));
}

#[tokio::test]
async fn a_keyed_publish_resent_after_it_was_stored_is_a_duplicate_read_as_held_already() {
    let Some((_server, t)) = start().await else {
        return;
    };
    assert_already_held(single_after_a_lost_answer(&t, true).await);
}

/// The last sequences a fake JetStream reports, one per stall check (the last repeats), and
/// how many checks were made.
fn reporting(
    lasts: &[Option<u64>],
) -> (
    impl Fn() -> std::future::Ready<Option<u64>>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let checks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (lasts, c) = (lasts.to_vec(), checks.clone());
    let f = move || {
        let i = c.fetch_add(1, Ordering::Relaxed);
        std::future::ready(lasts[i.min(lasts.len() - 1)])
    };
    (f, checks)
}

#[tokio::test(start_paused = true)]
async fn a_follower_that_gets_nothing_while_jetstream_holds_its_next_message_is_stuck() {
    // Idle at first (JetStream's last is below the next to apply), then unanswered, then
    // holding the next: stuck at the third check, not before.
    let (last_seq, checks) = reporting(&[Some(6), None, Some(9)]);
    let start = tokio::time::Instant::now();
    let mut msgs = futures::stream::pending::<u64>();
    let stuck = tokio::time::timeout(
        FOLLOW_STALL_CHECK * 10,
        next_or_stuck(&mut msgs, 7, last_seq),
    );
    assert_eq!(stuck.await, Ok(Wait::Stuck(9)));
    assert_eq!(checks.load(Ordering::Relaxed), 3);
    assert_eq!(start.elapsed(), FOLLOW_STALL_CHECK * 3);
    // At the next one exactly is stuck too.
    let (last_seq, _) = reporting(&[Some(7)]);
    assert_eq!(next_or_stuck(&mut msgs, 7, last_seq).await, Wait::Stuck(7));
}

#[tokio::test(start_paused = true)]
async fn an_idle_follower_waits_on_and_a_message_or_the_end_comes_through() {
    let (last_seq, checks) = reporting(&[Some(6)]);
    let mut msgs = futures::stream::pending::<u64>();
    let waited = tokio::time::timeout(
        FOLLOW_STALL_CHECK * 41 / 2,
        next_or_stuck(&mut msgs, 7, last_seq),
    )
    .await;
    assert!(waited.is_err(), "an idle shard is not stuck: {waited:?}");
    assert_eq!(checks.load(Ordering::Relaxed), 20, "checked at each period");
    let (last_seq, checks) = reporting(&[Some(100)]);
    let mut msgs = futures::stream::iter([7u64]);
    assert_eq!(
        next_or_stuck(&mut msgs, 7, &last_seq).await,
        Wait::Message(7)
    );
    assert_eq!(next_or_stuck(&mut msgs, 8, &last_seq).await, Wait::Ended);
    assert_eq!(
        checks.load(Ordering::Relaxed),
        0,
        "no check while messages come"
    );
}

#[tokio::test]
async fn a_follower_whose_consumer_is_recreated_from_the_first_message_starts_again_at_its_next() {
    let Some((_server, t)) = start().await else {
        return;
    };
    for p in publishes(false, EVENTS) {
        crate::msg::send(&t.js, &t.msg(p))
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let (tx, mut rx) = mpsc::channel(64);
    let out = Out {
        tx,
        armed: Arc::new(AtomicBool::new(false)),
        wake: Arc::new(|| {}),
    };
    let s = t.streams[&0].clone();
    let from = EVENTS + 1;
    let follower = tokio::spawn({
        let s = s.clone();
        async move { follow_from(&s, 0, from, &out, "test").await }
    });
    // The follower's consumer, once it exists, deleted under it: async-nats recreates it
    // from the stream's first message (it delivered none yet).
    let deadline = tokio::time::Instant::now() + START_WAIT;
    let name = loop {
        let names: Vec<String> = s
            .consumer_names()
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .flatten()
            .collect();
        if let Some(n) = names.into_iter().next() {
            break n;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no consumer within {START_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(s.delete_consumer(&name).await.unwrap().success);
    let ended = tokio::time::timeout(START_WAIT, follower).await;
    let ended = ended.expect("the follower ends at the replay").unwrap();
    assert_eq!(
        ended.map_err(|(next, e)| (next, e.starts_with("consumer restarted at 1,"))),
        Err((from, true)),
        "it asks again from its next"
    );
    assert!(
        rx.try_recv().is_err(),
        "nothing below its next was delivered"
    );
}
