//! What the node's cores share, as the gateway's `main` makes it, for the simulator's cores.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use gateway::core::Shared;
use log_store::Log;

/// What the node's cores share, as `main` makes it (one shard per core), and each core's
/// handoff receiver.
pub(super) struct Node {
    pub(super) shared: Shared,
    pub(super) rxs: Vec<crossbeam::channel::Receiver<gateway::core::Handoff>>,
}

impl Node {
    pub(super) fn new(cfg: &gateway::config::Config, logs: &[Log]) -> Result<Node, String> {
        let n = logs.len();
        let verifier = auth::Verifier::load(&cfg.auth.settings()).map_err(|e| e.to_string())?;
        let verifier = Arc::new(verifier);
        let keys = Arc::new(auth::Keys::new(verifier.clone()));
        let (txs, rxs) = (0..n).map(|_| crossbeam::channel::unbounded()).unzip();
        let eventfds = (0..n)
            .map(|_| gateway::sys::eventfd().map_err(|e| e.to_string()))
            .collect::<Result<Vec<OwnedFd>, _>>()?;
        let shared = Shared {
            access_log: gateway::access_log::Sink::off(),
            cluster: None,
            cfg: cfg.clone(),
            cores: n,
            shards: n as u32,
            handoff_tx: txs,
            eventfds,
            metrics: (0..n)
                .map(|_| gateway::metrics::CoreMetrics::default())
                .collect(),
            connections: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            epochs: logs.iter().map(Log::epoch).collect(),
            uring_cmd: false,
            keys,
            verifier,
            certs: match (&cfg.tls_cert_file, &cfg.tls_key_file) {
                (Some(c), Some(k)) => Some(gateway::tls::Certs::load(c, k)?),
                _ => None,
            },
            origins: Arc::from(Vec::<String>::new()),
            quota: gateway::streams::catalog::StreamQuota::new(cfg.streams_max, logs),
            subjects: gateway::streams::subjects::SubjectQuota::new(cfg.streams_per_subject_max()),
            mcp_key: None,
            mcp_sessions: Default::default(),
            per_ip: std::sync::Mutex::new(std::collections::HashMap::new()),
            body_budget: Arc::new(gateway::proto::conn::BodyBudget::new(
                cfg.request_buffer_bytes_max,
            )),
            ktls_refused: std::sync::atomic::AtomicU8::new(0),
        };
        Ok(Node { shared, rxs })
    }
}
