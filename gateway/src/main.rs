//! The `gateway` binary: parses the CLI, probes io_uring, loads the shard map and opens every
//! shard's log, binds one SO_REUSEPORT listener per core, starts one pinned reactor thread per
//! core, prints `listening on <addr>`, and on SIGINT/SIGTERM asks every core to stop
//! accepting, make its logs durable and close, then exits 0. The parts live in the library
//! (`lib.rs`), so that the simulator (`sim/`) can drive them too.

use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use gateway::mcp::identity::SessionKey;
use gateway::streams::catalog::StreamQuota;
use gateway::streams::hub::SyncDir;
use gateway::streams::subjects::SubjectQuota;
use gateway::{
    access_log, admin, clustering, config, config_file, core, logging, metrics, notify, probe,
    proto, shards, sys, tls,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Shard count when the data directory is new and `--shards-on-create` is 0.
const SHARDS_DEFAULT: u32 = 8;

fn main() {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let check_only = args.get(1).is_some_and(|a| a == "check-config");
    if check_only {
        args.remove(1);
    }
    let loaded = match config_file::load(args) {
        Ok(l) => l,
        Err(config_file::Failure::Clap(e)) => e.exit(),
        Err(config_file::Failure::File(errors)) => {
            for e in errors {
                eprintln!("gateway: {e}");
            }
            std::process::exit(2);
        }
    };
    if check_only {
        check_config(&loaded);
    }
    let cfg = loaded.cfg;
    if let Err(e) = logging::init(&cfg.log) {
        eprintln!("gateway: {e}");
        std::process::exit(2);
    }
    if let Err(e) = cfg.validate() {
        tracing::error!("{e}");
        std::process::exit(2);
    }
    let features = match probe::probe() {
        Ok(f) => f,
        Err(e) => {
            tracing::error!("{e}");
            std::process::exit(1);
        }
    };
    // A broken invariant in any reactor crashes the whole process loudly; the log recovers.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::abort();
    }));
    if let Err(e) = run(cfg, features) {
        tracing::error!("{e}");
        std::process::exit(1);
    }
}

/// `gateway check-config`: validates without starting; prints the effective configuration and
/// exits 0, or prints the errors and exits 2.
fn check_config(loaded: &config_file::Loaded) -> ! {
    match loaded.cfg.validate() {
        Ok(()) => {
            print!("{}", config_file::describe(loaded));
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("gateway: {e}");
            std::process::exit(2)
        }
    }
}

/// Starts every core, prints `listening on <addr>`, waits for SIGINT/SIGTERM, stops.
fn run(cfg: config::Config, features: probe::Features) -> Result<(), String> {
    // Before any thread starts (they inherit the mask): a process-directed SIGTERM goes to a
    // thread that does not block it, and one that did not would die of it (1 stop in 10 did).
    let signals = sys::block_shutdown_signals();
    let cpus = sys::allowed_cpus();
    let cores = Some(cfg.cores)
        .filter(|&n| n > 0)
        .unwrap_or(cpus.len().max(1));
    start_log_threads();
    let shard_count = shard_count(&cfg)?;
    let (txs, rxs, eventfds) = handoff_channels(cores)?;
    let (logs_per_core, epochs, clustered, follow_from) =
        logs_and_cluster(&cfg, cores, shard_count, &eventfds)?;
    let all_logs = logs_per_core.iter().flatten().map(|(_, log)| log);
    let quota = StreamQuota::new(cfg.streams_max, all_logs);
    raise_fd_limit(&cfg, shard_count);
    let (listeners, addr) = bind_listeners(&cfg, cores)?;
    let (admin_listener, admin_addr) = bind_admin(cfg.admin_listen)?;
    let (keys, certs, mcp_key) = load_keys(&cfg)?;
    let verifier = keys.current().1;
    let (cluster, inboxes) = match clustered {
        Some(c) => (Some(c.cluster), c.inboxes.into_iter().map(Some).collect()),
        None => (None, (0..cores).map(|_| None).collect::<Vec<_>>()),
    };
    let (access_log, access_writer) = access_log::start(&cfg.log)?;
    let shared = Arc::new(core::Shared {
        access_log,
        cluster: cluster.clone(),
        cfg: cfg.clone(),
        cores,
        shards: shard_count,
        handoff_tx: txs,
        eventfds,
        metrics: (0..cores)
            .map(|_| metrics::CoreMetrics::default())
            .collect(),
        connections: AtomicUsize::new(0),
        shutdown: AtomicBool::new(false),
        epochs,
        uring_cmd: features.uring_cmd,
        keys,
        verifier,
        certs,
        origins: cfg.cors_allow_origins.clone().into(),
        quota,
        subjects: SubjectQuota::new(cfg.streams_per_subject_max()),
        mcp_key,
        mcp_sessions: Default::default(),
        per_ip: std::sync::Mutex::new(std::collections::HashMap::new()),
        body_budget: Arc::new(proto::conn::BodyBudget::new(cfg.request_buffer_bytes_max)),
        ktls_refused: std::sync::atomic::AtomicU8::new(0),
    });
    let storage = with_sync_dirs(&cfg, shard_count, logs_per_core, features.msg_ring)?;
    let setups = core_setups(&cfg, &cpus, cores, rxs, storage, listeners, inboxes);
    let threads = start_cores(setups, &shared)?;
    if let Some(c) = &cluster {
        for (shard, from) in follow_from {
            c.follow(shard, from);
        }
    }
    admin::spawn(admin_listener, shared.clone()).map_err(|e| format!("admin thread: {e}"))?;
    announce(&cfg, &shared, addr, admin_addr);
    let notifier = start_notifying(&shared);
    let sig = wait_for_stop(&signals, &shared, notifier.as_deref());
    tracing::info!(signal = sig, "shutting down");
    notify::notify(notifier.as_deref(), "STOPPING=1");
    stop_cores(&shared, threads);
    access_log::stop(access_writer);
    Ok(())
}

/// The admin listener (`--admin-listen`) and its address.
fn bind_admin(
    at: std::net::SocketAddr,
) -> Result<(std::net::TcpListener, std::net::SocketAddr), String> {
    let listener =
        std::net::TcpListener::bind(at).map_err(|e| format!("bind --admin-listen {at}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    Ok((listener, addr))
}

/// The JWT keys (key files, and each JWKS URL's first fetch; the `jwt-jwks` thread keeps
/// them fresh from then on), the TLS certificate and key, and the MCP session key (made at the
/// first start with the MCP front).
type Keys = (Arc<auth::Keys>, Option<tls::Certs>, Option<SessionKey>);

fn load_keys(cfg: &config::Config) -> Result<Keys, String> {
    let verifier = auth::Verifier::load(&cfg.auth.settings()).map_err(|e| e.to_string())?;
    let keys = Arc::new(auth::Keys::new(Arc::new(verifier)));
    gateway::jwks::start(&cfg.auth.jwks(), &keys)?;
    let certs = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
        (Some(c), Some(k)) => Some(tls::Certs::load(c, k)?),
        _ => None,
    };
    let mcp_key = (cfg.mcp.enabled())
        .then(|| SessionKey::load_or_create(&cfg.data_dir))
        .transpose()?;
    Ok((keys, certs, mcp_key))
}

/// The start line: what this process is and how it is configured (no secret: NATS URLs lose
/// their user information).
fn log_start(cfg: &config::Config, shared: &core::Shared, addr: std::net::SocketAddr, ktls: bool) {
    let auth = match (&cfg.auth, cfg.auth.configured()) {
        (_, false) => "none",
        (a, true) if !a.keys_configured() => "anonymous patterns only",
        (a, _) if a.jwt_jwks_urls.is_empty() => "jwt",
        _ => "jwt (jwks)",
    };
    let tls = match (shared.certs.is_some(), ktls && tls::ktls_available()) {
        (false, _) => "off",
        (true, true) => "kernel records, userspace handshakes",
        (true, false) => "userspace",
    };
    let upstream = match (&cfg.mcp.upstream_cmd, &cfg.mcp.upstream_url) {
        (Some(_), _) => "stdio",
        (None, Some(_)) => "http",
        (None, None) => "off",
    };
    let nats: Vec<String> = cfg
        .cluster
        .nats_urls
        .iter()
        .map(|u| cluster::names::redact_url(u))
        .collect();
    tracing::info!(
        version = gateway::VERSION,
        commit = gateway::COMMIT,
        %addr,
        cores = shared.cores,
        shards = shared.shards,
        fsync = ?cfg.fsync_policy(),
        auth,
        tls,
        cluster = %nats.join(","),
        mcp_upstream = upstream,
        "gateway started"
    );
}

/// The last line: what the process did, as fields.
fn log_stop(shared: &core::Shared, started: std::time::Instant) {
    let sum = |f: fn(&metrics::CoreMetrics) -> &std::sync::atomic::AtomicU64| -> u64 {
        shared.metrics.iter().map(|m| f(m).load(Relaxed)).sum()
    };
    tracing::info!(
        stop_ms = started.elapsed().as_millis() as u64,
        requests = shared
            .metrics
            .iter()
            .map(|m| m.requests_answered())
            .sum::<u64>(),
        events_appended = sum(|m| &m.events_appended_total),
        events_sent = sum(|m| &m.events_sent_total),
        connections_accepted = sum(|m| &m.accepted_total),
        "gateway stopped"
    );
}

/// Each core's setup: its CPU (round-robin over the allowed CPUs, unless more cores than CPUs
/// were asked for), a listener for each of the first cores, its handoff receiver, its logs with
/// its sync directory (`--fsync-scope`), and its cluster inbox.
fn core_setups(
    cfg: &config::Config,
    cpus: &[usize],
    cores: usize,
    rxs: Vec<crossbeam::channel::Receiver<core::Handoff>>,
    storage: Vec<CoreStorage>,
    listeners: Vec<OwnedFd>,
    mut inboxes: Vec<Option<::cluster::Inbox>>,
) -> Vec<core::CoreSetup> {
    let mut listeners = listeners.into_iter();
    rxs.into_iter()
        .zip(storage)
        .enumerate()
        .map(|(id, (rx, (logs, sync_dir)))| core::CoreSetup {
            id,
            cpu: (cfg.cores == 0 || cores <= cpus.len()).then(|| cpus[id % cpus.len()]),
            listener: listeners.next(),
            rx,
            logs,
            sync_dir,
            inbox: inboxes[id].take(),
            mcp_outside: None,
        })
        .collect()
}

/// The log's background threads: segment retirement and next-segment preparation. Without
/// them the reactors do that work themselves (said as a warning).
fn start_log_threads() {
    // munmap/unlink of retired segments happen on a background thread, not on a reactor.
    if let Err(e) = log_store::retire_in_background() {
        tracing::warn!("no segment-retirement thread ({e}); reactors retire");
    }
    // Next-segment preparation and retention checkpoints off the reactors (before open_logs).
    if let Err(e) = log_store::prepare_in_background() {
        tracing::warn!("no log-prepare thread ({e}); reactors create segments");
    }
}

/// Every core's gauges of the TLS paths on offer: the record layer always, kernel TLS with
/// `--tls-kernel auto` where the kernel has it.
fn show_tls_paths(shared: &core::Shared, ktls: bool) {
    for m in &shared.metrics {
        m.tls_userspace.store(1, Relaxed);
        m.tls_kernel
            .store(u64::from(ktls && tls::ktls_available()), Relaxed);
    }
}

/// Tells every core to stop, wakes each, and waits for their threads.
fn stop_cores(shared: &core::Shared, threads: Vec<std::thread::JoinHandle<()>>) {
    let started = std::time::Instant::now();
    shared.shutdown.store(true, Relaxed);
    for fd in &shared.eventfds {
        sys::eventfd_wake(fd.as_fd());
    }
    for t in threads {
        let _ = t.join();
    }
    log_stop(shared, started);
}

/// Each core's handoff channel and eventfd.
type Channels = (
    Vec<crossbeam::channel::Sender<core::Handoff>>,
    Vec<crossbeam::channel::Receiver<core::Handoff>>,
    Vec<OwnedFd>,
);

fn handoff_channels(cores: usize) -> Result<Channels, String> {
    let mut txs = Vec::with_capacity(cores);
    let mut rxs = Vec::with_capacity(cores);
    let mut eventfds = Vec::with_capacity(cores);
    for _ in 0..cores {
        let (tx, rx) = crossbeam::channel::unbounded();
        txs.push(tx);
        rxs.push(rx);
        eventfds.push(sys::eventfd().map_err(|e| format!("eventfd: {e}"))?);
    }
    Ok((txs, rxs, eventfds))
}

/// `listening on <addr>` and `admin listener on <addr>` on stdout (what scripts wait for), then
/// the start line and which TLS path serves in the log.
fn announce(
    cfg: &config::Config,
    shared: &core::Shared,
    addr: std::net::SocketAddr,
    admin_addr: std::net::SocketAddr,
) {
    let ktls = cfg.tls_kernel == config::TlsKernel::Auto;
    if shared.certs.is_some() {
        show_tls_paths(shared, ktls);
    }
    metrics::set_limits(vec![
        ("connections_max", cfg.connections_max as u64),
        ("streams_max", cfg.streams_max),
        ("streams_per_subject_max", cfg.streams_per_subject_max()),
        ("request_buffer_bytes_max", cfg.request_buffer_bytes_max),
        ("mcp_sessions_max", cfg.mcp.mcp_sessions_max as u64),
    ]);
    announce_addrs(addr, admin_addr);
    log_start(cfg, shared, addr, ktls);
    if shared.certs.is_some() {
        log_tls_path(addr, ktls);
    }
}

fn announce_addrs(addr: std::net::SocketAddr, admin_addr: std::net::SocketAddr) {
    // Errors ignored: a supervisor that closed our stdout must not stop the gateway.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening on {addr}");
    let _ = writeln!(out, "admin listener on {admin_addr}");
    let _ = out.flush();
}

/// Which TLS path serves (`ktls`: `--tls-kernel auto`).
fn log_tls_path(addr: std::net::SocketAddr, ktls: bool) {
    let records = match (ktls, tls::ktls_available()) {
        (false, _) => "the gateway's record layer (--tls-kernel off)",
        (true, true) => "the kernel (tls is in /proc/sys/net/ipv4/tcp_available_ulp)",
        (true, false) => {
            "the kernel if it loads its tls ULP (not in /proc/sys/net/ipv4/tcp_available_ulp), \
             else the gateway's record layer"
        }
    };
    tracing::info!(
        "TLS on {addr}: handshakes and answers in userspace (rustls); subscribers' \
         records sealed by {records}"
    );
}

/// Under systemd (`Type=notify`): `READY=1` now that every core listens, and the watchdog
/// when the unit asks for one.
fn start_notifying(shared: &Arc<core::Shared>) -> Option<Arc<notify::Notifier>> {
    let n = Arc::new(notify::Notifier::from_env()?);
    n.send("READY=1\nSTATUS=listening");
    if let Some(period) = notify::watchdog_period()
        && let Err(e) = notify::spawn_watchdog(n.clone(), period, shared.clone())
    {
        tracing::error!("no watchdog thread: {e}");
    }
    Some(n)
}

/// Waits for SIGINT or SIGTERM; SIGHUP meanwhile reloads the TLS certificate and key (new
/// handshakes take the pair on disk now; established connections keep theirs).
fn wait_for_stop(
    signals: &libc::sigset_t,
    shared: &core::Shared,
    n: Option<&notify::Notifier>,
) -> i32 {
    loop {
        let sig = sys::wait_signal(signals);
        if sig != libc::SIGHUP {
            return sig;
        }
        notify::notify(n, &notify::reloading_message());
        reload(shared);
        notify::notify(n, "READY=1");
    }
}

/// SIGHUP: the JWT key files and the TLS certificate and key are read again; a file that no
/// longer loads keeps what was loaded before (and says so). The JWKS key sets in use are kept
/// (the `jwt-jwks` thread refreshes them on its own schedule). Connections stay up.
fn reload(shared: &core::Shared) {
    if shared.verifier.keys_configured() {
        let settings = shared.cfg.auth.settings();
        let reloaded = shared.keys.update(|cur| {
            auth::Verifier::load(&settings).map(|v| Some(v.with_jwks(cur.jwks().to_vec())))
        });
        match reloaded {
            Ok(_) => tracing::info!("SIGHUP: JWT keys reloaded"),
            Err(e) => tracing::error!("SIGHUP: JWT key reload failed, keeping the old keys: {e}"),
        }
    }
    match &shared.certs {
        Some(c) => match c.reload() {
            Ok(()) => tracing::info!("SIGHUP: TLS certificate and key reloaded"),
            Err(e) => tracing::error!("SIGHUP: reload failed, keeping the old pair: {e}"),
        },
        None => tracing::info!("SIGHUP: no TLS configured; nothing to reload"),
    }
}

/// The logs, in cluster mode after the cluster's streams were found: the logs per core, the
/// epochs, the cluster, and where each shard's follower starts.
type Storage = (
    Vec<Vec<(u32, log_store::Log)>>,
    Vec<log_store::Epoch>,
    Option<clustering::Clustered>,
    Vec<(u32, u64)>,
);

fn logs_and_cluster(
    cfg: &config::Config,
    cores: usize,
    shard_count: u32,
    eventfds: &[OwnedFd],
) -> Result<Storage, String> {
    let clustered = match cfg.cluster.enabled() {
        true => Some(clustering::start(
            &cfg.cluster,
            shard_count,
            cores,
            eventfds,
        )?),
        false => None,
    };
    let js = clustered.as_ref().map(|c| &c.streams[..]);
    let (logs_per_core, epochs) = open_logs(cfg, cores, shard_count, js)?;
    let follow_from = logs_per_core
        .iter()
        .flatten()
        .map(|(s, log)| (*s, clustering::applied(log) + 1))
        .collect();
    Ok((logs_per_core, epochs, clustered, follow_from))
}

/// A core's logs, by shard, and its sync directory (`--fsync-scope`).
type CoreStorage = (Vec<(u32, log_store::Log)>, Option<SyncDir>);

/// Logs of each core (shard `s` belongs to core `s % cores`) and every shard's epoch.
type OpenLogs = (Vec<Vec<(u32, log_store::Log)>>, Vec<log_store::Epoch>);

/// The shard count (stored on creation, reused on every restart).
fn shard_count(cfg: &config::Config) -> Result<u32, String> {
    let on_create = if cfg.shards_on_create == 0 {
        SHARDS_DEFAULT
    } else {
        cfg.shards_on_create
    };
    shards::load_or_create(&cfg.data_dir, on_create)
        .map_err(|e| format!("--data-dir {}: {e}", cfg.data_dir.display()))
}

/// Opens (recovering) every shard's log; in cluster mode under the shard's cluster epoch.
fn open_logs(
    cfg: &config::Config,
    cores: usize,
    shard_count: u32,
    js: Option<&[cluster::ShardStream]>,
) -> Result<OpenLogs, String> {
    let opts = log_store::LogOptions {
        segment_bytes: cfg.segment_bytes,
        retain_bytes: (cfg.retain_bytes > 0).then_some(cfg.retain_bytes),
        retain_secs: (cfg.retain_secs > 0).then_some(cfg.retain_secs),
        fsync: cfg.fsync_policy(),
        // Framing adds the id line, the event line and "data: " per line of data.
        // Capped at half a segment so any --segment-bytes the log accepts works; an event
        // whose framing exceeds it is refused with 413.
        record_bytes_max: u32::try_from(
            (cfg.event_bytes_max as u64)
                .saturating_mul(2)
                .saturating_add(4096)
                .min(cfg.segment_bytes / 2),
        )
        .unwrap_or(u32::MAX),
        epoch_on_create: None,
    };
    let mut logs_per_core: Vec<Vec<(u32, log_store::Log)>> =
        (0..cores).map(|_| Vec::new()).collect();
    let mut epochs = Vec::with_capacity(shard_count as usize);
    for s in 0..shard_count {
        let dir = shards::shard_dir(&cfg.data_dir, s);
        let log = match js {
            Some(js) => clustering::open_log(&dir, opts.clone(), &js[s as usize])?,
            None => log_store::Log::open(&dir, opts.clone())
                .map_err(|e| format!("opening shard {s} at {}: {e}", dir.display()))?,
        };
        epochs.push(log.epoch());
        logs_per_core[shards::core_of_shard(s, cores)].push((s, log));
    }
    Ok((logs_per_core, epochs))
}

/// Each core's logs with its sync directory (`--fsync-scope`): its own descriptor of the data
/// directory when rounds of group commits are one `syncfs`, else none.
fn with_sync_dirs(
    cfg: &config::Config,
    shard_count: u32,
    logs_per_core: Vec<Vec<(u32, log_store::Log)>>,
    msg_ring: bool,
) -> Result<Vec<CoreStorage>, String> {
    let cores = logs_per_core.len();
    let shard_dirs: Vec<_> = (0..shard_count)
        .map(|s| shards::shard_dir(&cfg.data_dir, s))
        .collect();
    if !gateway::sync_scope::decide(cfg.fsync_scope, &cfg.data_dir, &shard_dirs, msg_ring)? {
        return Ok(logs_per_core.into_iter().map(|l| (l, None)).collect());
    }
    tracing::info!(
        "group commits: one syncfs of the data directory's filesystem per round of several files"
    );
    let dirs = gateway::sync_scope::open_dirs(&cfg.data_dir, cores)?;
    let sync_dir = |fd| Some(SyncDir { fd, files_min: 2 });
    Ok(logs_per_core
        .into_iter()
        .zip(dirs.into_iter().map(sync_dir))
        .collect())
}

/// Every connection is an fd; leave room for logs, listeners and eventfds.
fn raise_fd_limit(cfg: &config::Config, shard_count: u32) {
    let fds_wanted = cfg.connections_max as u64 + 256 + u64::from(shard_count) * 8;
    match sys::raise_nofile(fds_wanted) {
        Ok(n) if n < fds_wanted => tracing::warn!(
            "RLIMIT_NOFILE is {n}, below --connections-max plus overhead \
             ({fds_wanted}); accepts will fail with EMFILE before the limit"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise RLIMIT_NOFILE: {e}"),
    }
}

/// One SO_REUSEPORT listener per listening core: the first binds `--listen` (refusing a
/// port another process listens on), the others the port it got.
fn bind_listeners(
    cfg: &config::Config,
    cores: usize,
) -> Result<(Vec<OwnedFd>, std::net::SocketAddr), String> {
    let listen_cores = if cfg.listen_cores_max == 0 {
        cores
    } else {
        cfg.listen_cores_max.min(cores)
    };
    let mut listeners = Vec::with_capacity(listen_cores);
    let first =
        sys::listener_first(cfg.listen, 4096).map_err(|e| format!("bind {}: {e}", cfg.listen))?;
    let addr = sys::local_addr(first.as_fd()).map_err(|e| e.to_string())?;
    listeners.push(first);
    for _ in 1..listen_cores {
        listeners.push(sys::listener(addr, 4096).map_err(|e| format!("bind {addr}: {e}"))?);
    }
    Ok((listeners, addr))
}

/// Spawns one thread per core and waits until every ring is armed.
fn start_cores(
    setups: Vec<core::CoreSetup>,
    shared: &Arc<core::Shared>,
) -> Result<Vec<std::thread::JoinHandle<()>>, String> {
    let cores = setups.len();
    let (ready_tx, ready_rx) = crossbeam::channel::bounded(cores);
    let mut threads = Vec::with_capacity(cores);
    for setup in setups {
        let id = setup.id;
        let shared = shared.clone();
        let ready_tx = ready_tx.clone();
        let t = std::thread::Builder::new()
            .name(format!("core-{id}"))
            .spawn(move || {
                core::run_core(setup, shared, |r| {
                    let _ = ready_tx.send(r);
                })
            })
            .map_err(|e| format!("spawn core {id}: {e}"))?;
        threads.push(t);
    }
    for _ in 0..cores {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("a core thread exited during start".into()),
        }
    }
    Ok(threads)
}
