//! The ureq agents towards one upstream: their configuration (timeouts, trust, proxy, pool
//! bounds), DNS per connection through a [`Resolver`], and a transport wrapper that counts
//! connections and reuses and tells the thread that sends a request what its connection did
//! (reused or fresh, request written, answer begun): what the retry rule and the
//! error classification in `shared.rs` need and ureq does not report.
//!
//! Not here: the HTTP framing, the pool and the TLS handshake (ureq's), proxy tunnels (ureq's
//! CONNECT connector; which proxy is `proxy.rs`'s decision).

use crossbeam::channel::Sender;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use ureq::http::Uri;
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, DefaultConnector, NextTimeout, Transport,
};
use ureq::{Agent, Proxy};

/// Resolve, connect (each address), TLS handshake, proxy tunnel, and writing a request: each
/// bounded by this.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Counters of one endpoint's connections (`/metrics`), over every client's agent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Connections opened (TCP connected; for TLS, also the handshake done).
    pub connections_opened: u64,
    /// Connections open now, idle or carrying a request.
    pub connections_open: u64,
    /// Requests sent on a connection that had carried an earlier answer.
    pub requests_reused: u64,
    /// Requests sent again on a fresh connection after a reused one turned out closed.
    pub requests_retried: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    opened: AtomicU64,
    open: AtomicU64,
    reused: AtomicU64,
    retried: AtomicU64,
}

impl Counters {
    pub(super) fn note_retry(&self) {
        self.retried.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn stats(&self) -> PoolStats {
        PoolStats {
            connections_opened: self.opened.load(Ordering::Relaxed),
            connections_open: self.open.load(Ordering::Relaxed),
            requests_reused: self.reused.load(Ordering::Relaxed),
            requests_retried: self.retried.load(Ordering::Relaxed),
        }
    }
}

/// What the calling thread's latest request did on its connection.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Attempt {
    /// It went out on a connection that had carried an earlier answer.
    pub(super) reused: bool,
    /// The whole request was written (ureq began waiting for the answer).
    pub(super) sent: bool,
    /// At least one byte of an answer arrived.
    pub(super) answered: bool,
}

thread_local! {
    static ATTEMPT: Cell<Attempt> = const { Cell::new(Attempt { reused: false, sent: false, answered: false }) };
    static ON_SENT: RefCell<Option<Sender<()>>> = const { RefCell::new(None) };
}

/// Starts watching the next request of this thread; `on_sent` is signalled (once) when it has
/// been written whole. The requests of one thread are sequential, so what its transports see
/// from here on is this request's.
pub(super) fn begin_attempt(on_sent: Option<Sender<()>>) {
    ATTEMPT.set(Attempt::default());
    ON_SENT.set(on_sent);
}

/// What this thread's request did (after [`begin_attempt`]); drops the `on_sent` signal.
pub(super) fn end_attempt() -> Attempt {
    ON_SENT.set(None);
    ATTEMPT.get()
}

fn note(f: impl FnOnce(&mut Attempt)) {
    let mut a = ATTEMPT.get();
    f(&mut a);
    ATTEMPT.set(a);
}

/// Where a connection is in its exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Fresh,
    Writing,
    Reading,
}

/// A connection to the upstream (TLS included), counted and watched.
struct Counted {
    inner: Box<dyn Transport>,
    counters: Arc<Counters>,
    phase: Phase,
}

impl fmt::Debug for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counted")
            .field("phase", &self.phase)
            .finish()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Counted {
    /// Input is awaited: a request written before it is complete.
    fn on_await(&mut self) {
        if self.phase == Phase::Writing {
            note(|a| a.sent = true);
            if let Some(tx) = ON_SENT.take() {
                let _ = tx.send(());
            }
        }
        self.phase = Phase::Reading;
    }

    fn on_input(&mut self) {
        if !self.inner.buffers().input().is_empty() {
            note(|a| a.answered = true);
        }
    }
}

impl Transport for Counted {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        match self.phase {
            Phase::Reading => {
                // A new request after an answer: the connection is reused.
                self.counters.reused.fetch_add(1, Ordering::Relaxed);
                ATTEMPT.set(Attempt {
                    reused: true,
                    ..Attempt::default()
                });
            }
            Phase::Fresh => ATTEMPT.set(Attempt::default()),
            Phase::Writing => {}
        }
        self.phase = Phase::Writing;
        self.inner.transmit_output(amount, timeout)
    }

    fn maybe_await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.on_await();
        let r = self.inner.maybe_await_input(timeout);
        self.on_input();
        r
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.on_await();
        let r = self.inner.await_input(timeout);
        self.on_input();
        r
    }

    fn is_open(&mut self) -> bool {
        self.inner.is_open()
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
    }
}

/// The last link of the connector chain: wraps connections to the upstream's URL in
/// [`Counted`] (a CONNECT proxy's own connection, made through the same chain, is not).
#[derive(Debug)]
struct Counting {
    uri: Uri,
    counters: Arc<Counters>,
}

impl Connector<Box<dyn Transport>> for Counting {
    type Out = Box<dyn Transport>;

    fn connect(
        &self,
        details: &ConnectionDetails<'_>,
        chained: Option<Box<dyn Transport>>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(inner) = chained else {
            return Ok(None);
        };
        if *details.uri != self.uri {
            return Ok(Some(inner));
        }
        self.counters.opened.fetch_add(1, Ordering::Relaxed);
        self.counters.open.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Box::new(Counted {
            inner,
            counters: self.counters.clone(),
            phase: Phase::Fresh,
        })))
    }
}

/// One resolver shared by every agent of an endpoint (ureq's `DefaultResolver`: the system's
/// `getaddrinfo`, per connection; tests give their own).
#[derive(Debug, Clone)]
pub(super) struct SharedResolver(pub(super) Arc<dyn Resolver>);

impl Resolver for SharedResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        self.0.resolve(uri, config, timeout)
    }
}

/// What every agent of an endpoint is built from.
#[derive(Debug)]
pub(super) struct AgentParts {
    pub(super) uri: Uri,
    /// `https://`: the roots to verify the upstream against.
    pub(super) roots: Option<Arc<Vec<Certificate<'static>>>>,
    pub(super) proxy: Option<Proxy>,
    pub(super) pool_connections_max: usize,
    pub(super) pool_idle: Duration,
    pub(super) resolver: SharedResolver,
    pub(super) counters: Arc<Counters>,
}

impl AgentParts {
    /// A new agent (its own pool; `Agent::shutdown` ends every connection of it). Answers with
    /// an error status are answers, not errors; redirects are not followed; there is no read
    /// timeout (POST answers and SSE streams live as long as the request does).
    pub(super) fn agent(&self) -> Agent {
        let mut tls = TlsConfig::builder().provider(TlsProvider::Rustls);
        if let Some(roots) = &self.roots {
            tls = tls.root_certs(RootCerts::Specific(roots.clone()));
        }
        let tls = tls
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .build();
        let config = Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .tls_config(tls)
            .proxy(self.proxy.clone())
            .timeout_resolve(Some(IO_TIMEOUT))
            .timeout_connect(Some(IO_TIMEOUT))
            .timeout_send_request(Some(IO_TIMEOUT))
            .timeout_send_body(Some(IO_TIMEOUT))
            .max_idle_connections(self.pool_connections_max)
            .max_idle_connections_per_host(self.pool_connections_max)
            .max_idle_age(self.pool_idle)
            .input_buffer_size(64 * 1024)
            .output_buffer_size(16 * 1024)
            .build();
        let connector = DefaultConnector::new().chain(Counting {
            uri: self.uri.clone(),
            counters: self.counters.clone(),
        });
        Agent::with_parts(config, connector, self.resolver.clone())
    }
}
