//! The per-core loop: one thread per core, pinned, each with its own io_uring driver, its own
//! SO_REUSEPORT listener (multishot accept), an eventfd read for cross-core handoffs and
//! shutdown, and the connections and shard logs it owns. Per turn: submit and wait, match
//! and dispatch every completion ([`dispatch`]), the MCP front's turn, group commit (answers
//! that became durable leave, subscribers of streams whose visible tail moved are pumped),
//! then the tick's timers. It only dispatches: HTTP decisions come from the connection
//! machine (`proto::conn`), stream decisions from `streams`, every submission goes through
//! `uring`.

mod close;
mod cluster;
mod cluster_state;
mod conns;
mod counts;
mod dispatch;
mod http;
mod lifecycle;
mod mcp;
mod mcp_apply;
mod mcp_calls;
mod mcp_cluster;
mod mcp_cluster_state;
mod mcp_drive;
mod mcp_metrics;
#[cfg(test)]
mod mcp_tests;
mod net;
mod publishing;
mod requests;
mod stepped;
mod subs;
mod tick;
mod waits;

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, Sender};
use log_store::{Epoch, Log};

use crate::config::Config;
use crate::metrics::CoreMetrics;
use crate::proto::access::Gate;
use crate::proto::conn::{BodyBudget, ConnLimits};
use crate::proto::http::HeadLimits;
use crate::streams::catalog::StreamQuota;
use crate::streams::hub::{Hub, SyncOp};
use crate::streams::idempotency::{self, Keys};
use crate::streams::parked::ParkLimits;
use crate::streams::sub::SubLimits;
use crate::streams::subjects::SubjectQuota;
use crate::sys;
use crate::uring::{Cqe, Driver};
use conns::State;
pub use mcp::McpOutside;
use net::{Net, Then};
pub use stepped::SteppedCore;

/// The tick: timers, `SIOCOUTQ` confirmation, keep-alives.
const TICK: Duration = Duration::from_millis(100);
/// Requests one connection may have processed per call before others get a turn.
const PIPELINED_PER_CALL_MAX: usize = 256;

/// Core `id`'s `Idempotency-Key` table, sized by the flags.
fn idempotency_keys(shared: &Shared, id: usize) -> Keys {
    let c = &shared.cfg;
    let (secs, per_stream) = (c.idempotency_window_secs, c.idempotency_keys_per_stream_max);
    let limits =
        idempotency::Limits::of_flags(secs, per_stream, c.idempotency_keys_max, shared.cores);
    Keys::new(limits, shared.metrics[id].idempotent_replays_total.clone())
}

/// The `Idempotency-Key`s this core's logs recovered, those still in the window remembered.
fn recover_keys(hub: &mut Hub, idem: &mut Keys, now: Instant) {
    let recovered = hub.take_recovered_keys();
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let (found, kept) = (recovered.len(), idem.recover(recovered, now, wall_ms));
    if found > 0 {
        tracing::info!(found, kept, "Idempotency-Keys recovered from the log");
    }
}

/// State shared by all cores (read-mostly).
#[derive(Debug)]
pub struct Shared {
    pub cfg: Config,
    pub cores: usize,
    pub shards: u32,
    pub handoff_tx: Vec<Sender<Handoff>>,
    /// Each core's eventfd (a write wakes its ring: handoffs, shutdown).
    pub eventfds: Vec<OwnedFd>,
    pub metrics: Vec<CoreMetrics>,
    pub connections: AtomicUsize,
    pub shutdown: AtomicBool,
    /// Every shard's log epoch, so an ID of another shard is named "another stream".
    pub epochs: Vec<Epoch>,
    pub uring_cmd: bool,
    /// JWT keys and anonymous patterns (each core has its own token cache over it).
    pub verifier: Arc<auth::Verifier>,
    /// The verifier as reloaded on SIGHUP (each core's gate takes it up at its next check).
    pub keys: Arc<auth::Keys>,
    /// `--cors-allow-origin`.
    pub origins: Arc<[String]>,
    /// Live API streams across all shards (`--streams-max`).
    pub quota: StreamQuota,
    /// API streams created per subject (`--streams-per-subject-max`).
    pub subjects: SubjectQuota,
    /// The key MCP session identities are derived with (when the MCP front is on).
    pub mcp_key: Option<crate::mcp::identity::SessionKey>,
    /// MCP sessions held by every core's MCP parts (`--mcp-sessions-max` bounds them all).
    pub mcp_sessions: crate::mcp::core::SessionCount,
    /// The listener's certificate and key (`--tls-cert-file`), reloaded on SIGHUP.
    pub certs: Option<crate::tls::Certs>,
    /// Open connections by peer address (`--connections-per-ip-max`).
    pub per_ip: Mutex<HashMap<IpAddr, u32>>,
    /// Bytes of request buffers beyond each connection's head buffer
    /// (`--request-buffer-bytes-max`).
    pub body_budget: Arc<BodyBudget>,
    /// Cluster mode (`--nats-url`): publishes go to JetStream.
    pub cluster: Option<::cluster::Cluster>,
    /// Key forms (`CryptoInfo::form_bit`) this kernel refused or cannot read back — all of
    /// them once it refused the `tls` ULP (it has no kernel TLS): their subscribers go to the
    /// record layer without asking again (`--tls-kernel`).
    pub ktls_refused: std::sync::atomic::AtomicU8,
    /// Where finished requests go (`--access-log`).
    pub access_log: crate::access_log::Sink,
}

/// A connection moving to the core that owns its stream: the fd and the bytes read so far.
#[derive(Debug)]
pub struct Handoff {
    pub fd: OwnedFd,
    pub bytes: Vec<u8>,
    /// The peer's address as counted in `Shared::per_ip` (the count moves with the fd).
    pub peer: Option<IpAddr>,
    /// The TLS session (it moves with the fd).
    pub tls: Option<Box<crate::tls::TlsConn>>,
}

/// What one core thread is given at start.
#[derive(Debug)]
pub struct CoreSetup {
    pub id: usize,
    pub cpu: Option<usize>,
    pub listener: Option<OwnedFd>,
    pub rx: Receiver<Handoff>,
    pub logs: Vec<(u32, Log)>,
    /// `--fsync-scope filesystem`: this core's own descriptor of the data directory, whose
    /// filesystem holds all its logs (one `syncfs` per round of group commits); `None`: one
    /// `fdatasync` per file.
    pub sync_dir: Option<crate::streams::hub::SyncDir>,
    /// Cluster mode: the messages of this core's shards, in JetStream order.
    pub inbox: Option<::cluster::Inbox>,
    /// The MCP front's upstreams and session IDs, if not the real ones (the simulator's);
    /// used by the core that owns the MCP shard.
    pub mcp_outside: Option<McpOutside>,
}

/// The limits of a core, from the flags.
#[derive(Debug)]
struct Limits {
    conn: ConnLimits,
    tls_handshake: Duration,
    sub: SubLimits,
    park: ParkLimits,
}

/// One core's reactor.
struct Core {
    id: usize,
    shared: Arc<Shared>,
    /// The connections, the listener and the driver their bytes go through.
    net: Net,
    /// This core's eventfd (owned by `shared`).
    efd: RawFd,
    rx: Receiver<Handoff>,
    hub: Hub,
    /// The subscribers and their windows, parked ones included.
    subs: subs::Subs,
    /// The `Idempotency-Key`s of this core's streams' publishes.
    idem: Keys,
    /// The answers waiting for durability.
    waits: waits::Waits,
    now: Instant,
    next_tick: Instant,
    next_retention: Instant,
    shutting_down: Option<Instant>,
    lim: Limits,
    /// This core's parts of the MCP front when it is on (on every core that owns a shard, or
    /// on the legacy MCP shard's owner only in cluster mode: `McpPlace`): the one of its MCP
    /// shard first, then any for shards whose sessions it recovered (`Mcp::on_core`).
    mcp: Vec<mcp::Mcp>,
    /// Which core serves a request on the MCP path (others are handed to it).
    mcp_place: crate::shards::McpPlace,
    /// CORS and authentication (with this core's token cache).
    gate: Gate,
    /// Cluster mode (`--nats-url`).
    cluster: Option<Box<cluster_state::ClusterCore>>,
}

fn limits(cfg: &Config) -> Limits {
    Limits {
        tls_handshake: Duration::from_secs(cfg.tls_handshake_timeout_secs),
        conn: ConnLimits {
            head: HeadLimits {
                header_bytes_max: cfg.header_bytes_max,
                header_count_max: cfg.header_count_max,
            },
            event_bytes_max: cfg.event_bytes_max,
            batch_bytes_max: cfg.batch_bytes_max,
            answer_bytes_max: cfg.pipeline_answer_bytes_max,
            mcp: cfg
                .mcp
                .enabled()
                .then(|| (cfg.mcp.mcp_path.clone(), cfg.mcp.mcp_body_bytes_max)),
            header_timeout: Duration::from_secs(cfg.header_timeout_secs),
            idle_timeout: Duration::from_secs(cfg.idle_timeout_secs),
            body_timeout: Duration::from_secs(cfg.body_timeout_secs),
        },
        sub: SubLimits {
            lag_events_max: cfg.lag_events_max,
            send_bytes_max: cfg.send_bytes_max,
            tx_ack_interval: Duration::from_millis(cfg.tx_ack_interval_ms),
            keepalive: Duration::from_secs(cfg.keepalive_secs),
        },
        park: ParkLimits {
            grace: Duration::from_secs(cfg.resume_grace_secs),
            per_stream_max: cfg.parked_windows_per_stream_max,
        },
    }
}

/// Runs one core until shutdown. `ready` is called once the ring is armed.
pub fn run_core(setup: CoreSetup, shared: Arc<Shared>, ready: impl FnOnce(Result<(), String>)) {
    if let Some(cpu) = setup.cpu
        && let Err(e) = sys::pin_to_cpu(cpu)
    {
        let id = setup.id;
        tracing::warn!(
            core = id,
            "cannot pin to cpu {cpu}: {e} (continuing unpinned)"
        );
    }
    let io = Driver::new(shared.cfg.connections_max)
        .map_err(|e| format!("core {}: io_uring setup failed: {e}", setup.id))
        .and_then(|mut io| {
            if setup.sync_dir.is_some() {
                // Started now: a failure stops the start, not a group commit later.
                (io.start_syncfs())
                    .map_err(|e| format!("core {}: its syncfs thread: {e}", setup.id))?;
            }
            Ok(io)
        });
    match io {
        Ok(io) => {
            let mut core = Core::new(setup, shared, io);
            ready(Ok(()));
            core.run();
        }
        Err(e) => ready(Err(e)),
    }
}

/// Seconds since the Unix epoch (token expiry is wall-clock time).
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Core {
    /// Core `setup.id` over `io`, its accept and eventfd read armed, its keys recovered.
    fn new(setup: CoreSetup, shared: Arc<Shared>, io: Driver) -> Core {
        let now = io.now();
        let shared_efd = shared.eventfds[setup.id].as_raw_fd();
        let gate = Gate::new(
            shared.origins.clone(),
            auth::Auth::following(shared.keys.clone()),
        );
        let mcp_outside = setup.mcp_outside;
        let clustered = match (setup.inbox, &shared.cluster) {
            (Some(inbox), Some(handle)) => Some(Box::new(cluster_state::ClusterCore::new(
                inbox,
                handle.clone(),
                &setup.logs,
            ))),
            _ => None,
        };
        let place = (clustered.is_some(), shared.cores, shared.shards);
        let lim = limits(&shared.cfg);
        let want_ts = shared.uring_cmd && !shared.cfg.no_tx_timestamps;
        let subs = subs::Subs::new(lim.sub, lim.park, want_ts);
        let net = Net::new(io, setup.listener, shared.clone(), setup.id, lim.sub, now);
        let mut core = Core {
            cluster: clustered,
            id: setup.id,
            lim,
            net,
            hub: Hub::new(setup.logs, shared.shards)
                .with_sync_dir(setup.sync_dir)
                .with_commit_hold(Duration::from_micros(shared.cfg.group_commit_hold_us_max)),
            idem: idempotency_keys(&shared, setup.id),
            shared,
            efd: shared_efd,
            rx: setup.rx,
            subs,
            waits: waits::Waits::default(),
            now,
            next_tick: now + TICK,
            next_retention: now,
            shutting_down: None,
            mcp: Vec::new(),
            mcp_place: crate::shards::McpPlace::new(place.0, place.1, place.2),
            gate,
        };
        recover_keys(&mut core.hub, &mut core.idem, now);
        core.net.arm_accept();
        core.net.io.read_eventfd(core.efd);
        core.mcp = mcp_drive::parts_on_core(
            &core.shared,
            (core.id, core.mcp_place),
            &core.hub,
            now,
            mcp_outside,
        );
        core
    }

    fn m(&self) -> &CoreMetrics {
        &self.shared.metrics[self.id]
    }

    fn run(&mut self) {
        let mut cqes: Vec<Cqe> = Vec::with_capacity(4096);
        while self.turn(&mut cqes) {}
        self.hub.sync_all(self.id);
    }

    /// One turn of the loop; `false` once the core is to stop.
    fn turn(&mut self, cqes: &mut Vec<Cqe>) -> bool {
        self.net.io.submit_and_wait(self.wait_duration());
        self.now = self.net.io.now();
        self.net.now = self.now;
        self.gate.now_unix_secs = unix_secs();
        cqes.clear();
        self.net.io.reap(cqes);
        self.waits.open_turn();
        for &cqe in cqes.iter() {
            if let Some(c) = self.net.io.complete(cqe) {
                self.dispatch(c);
            }
        }
        self.mcp_turn();
        self.cluster_turn();
        self.end_turn();
        if self.now >= self.next_tick {
            self.tick();
            self.next_tick = self.now + TICK;
        }
        let took = self.net.io.now().saturating_duration_since(self.now);
        self.m().turn_duration.observe(took);
        // MCP records still on their way through JetStream (cluster mode) hold the exit too:
        // they are the explicit ends of the sessions' requests.
        let done = self.shutting_down.is_some_and(|deadline| {
            self.live_connections() == 0 && !self.mcp_cluster_sending() || self.now >= deadline
        });
        !done
    }

    fn live_connections(&self) -> usize {
        self.net.conns.len()
    }

    fn wait_duration(&self) -> Duration {
        let until = [
            Some(self.next_tick),
            self.mcp_deadline(),
            self.hub.next_sync_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("the tick is always set");
        if self.cluster.as_ref().is_some_and(|c| c.busy()) {
            return Duration::from_micros(50); // more of the inbox waits: come back at once
        }
        until
            .saturating_duration_since(self.net.io.now())
            .max(Duration::from_micros(50))
    }

    /// What the core does next with a connection `Net` moved bytes for.
    fn then(&mut self, slot: u32, then: Then) {
        match then {
            Then::Wait => {}
            Then::Close => self.close_conn(slot),
            Then::Drive => self.drive_http(slot),
            Then::Pump => self.pump(slot),
        }
    }

    /// The turn's answers (those held by its publishes, those that became durable or whose
    /// group commit failed) and the subscribers of the streams touched this turn, the
    /// deliveries first when they are few ([`waits::DELIVER_FIRST_WOKEN_MAX`]); then the
    /// group commits due now.
    fn end_turn(&mut self) {
        for shard in self.hub.take_failed() {
            self.m().log_sync_failures_total.fetch_add(1, Relaxed);
            self.waits.fail(&mut self.net, shard);
        }
        self.mcp_log_check();
        let touched = self.hub.end_turn();
        let woken = self.subs.to_pump.len()
            + touched
                .iter()
                .map(|&k| self.hub.subscribers(k).len())
                .sum::<usize>();
        let deliver_first = waits::Waits::deliver_first(woken);
        if !deliver_first {
            self.send_answers(!touched.is_empty());
        }
        if !touched.is_empty() {
            self.wake(&touched);
        }
        if deliver_first {
            self.send_answers(!touched.is_empty());
        }
        for op in self.hub.start_syncs(self.now) {
            match op {
                SyncOp::File { shard, fd } => self.net.io.fsync(shard, fd),
                SyncOp::Filesystem { round, fd } => self.net.io.syncfs(round, fd),
            }
        }
        // Receives deferred by --request-buffer-bytes-max, now that this turn's requests and
        // closes may have released bytes (a deferral re-queues itself: no loop).
        self.retry_deferred_recvs();
    }

    /// The answers held to the end of the turn, then (`released`: a stream was touched) those
    /// whose wait became visible.
    fn send_answers(&mut self, released: bool) {
        self.waits.send_held(&mut self.net);
        if released {
            self.waits.complete(&mut self.net, &self.hub);
        }
    }

    /// Pumps the subscribers of `touched` streams.
    fn wake(&mut self, touched: &[crate::streams::StreamKey]) {
        // Collected first (pumping may close a subscriber and edit the registry).
        let (mut to_pump, now) = (std::mem::take(&mut self.subs.to_pump), self.now);
        for &key in touched {
            to_pump.extend_from_slice(self.hub.subscribers(key));
        }
        for &r in &to_pump {
            if requests::woken(self.net.conn_at(r), now) {
                self.pump(r.0);
            }
        }
        to_pump.clear();
        self.subs.to_pump = to_pump;
    }
}
