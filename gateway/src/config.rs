//! Command-line configuration of the gateway (clap derive): every limit is a flag with its unit
//! in the name and a default that works on a laptop. Validation of flag combinations lives in
//! [`Config::validate`]. This module does not open sockets or files.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// io_uring thread-per-core SSE publish/subscribe gateway with gap-free resumption.
#[derive(Debug, Clone, Parser)]
#[command(name = "gateway", version = crate::LONG_VERSION, about)]
pub struct Config {
    /// Address to listen on (each core binds its own SO_REUSEPORT listener). Port 0 picks an
    /// ephemeral port; the chosen address is printed as "listening on <addr>".
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Directory holding the shard map and one log per shard.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,

    /// Reactor threads, one per core, pinned. 0 = all online cores.
    #[arg(long, default_value_t = 0)]
    pub cores: usize,

    /// Shard count used only when the data directory is created; afterwards the persisted count
    /// (data-dir/shards.json) wins so a restart with another --cores routes streams identically.
    /// 0 = 8.
    #[arg(long, default_value_t = 0)]
    pub shards_on_create: u32,

    /// Bytes per log segment file. Each shard's active segment is mapped and pre-touched, so
    /// resident memory starts near shards x this (16 MiB x 8 shards = 128 MiB by default).
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    pub segment_bytes: u64,

    /// Bytes of segments kept per shard before the oldest sealed segment is deleted. 0 = unbounded.
    #[arg(long, default_value_t = 0)]
    pub retain_bytes: u64,

    /// Seconds a sealed segment is kept after its newest record. 0 = unbounded.
    #[arg(long, default_value_t = 0)]
    pub retain_secs: u64,

    /// Durability before a publish is acknowledged and before subscribers see the event:
    /// "group" (a group commit starts as soon as records are unsynced and none is in flight;
    /// what arrives meanwhile waits for the next), "interval:<ms>" (at most one per interval),
    /// "always" (as group) or "never" (visible at once; survives a process crash, not a power
    /// loss). log-store/DESIGN.md, "Durability and visibility". Default: "group"; in cluster
    /// mode "never" (the durable copy is JetStream's quorum; a node that loses its local tail
    /// in a crash re-applies it from JetStream under the same IDs).
    #[arg(long)]
    pub fsync: Option<String>,

    /// What one round of group commits syncs when it names several files (a core's shards
    /// each sync their own segment files). `file` (default): one `fdatasync` per file, all in
    /// flight at once (on ext4 each is a journal commit of its own). `filesystem`: one
    /// `syncfs` of the data directory's filesystem for the whole round, one round in flight
    /// per core (one journal commit, but two hand-offs to the kernel's writeback worker; it
    /// also writes back every other dirty file of that filesystem, and a writeback error of
    /// any of them fails the round and stops its shards' logs, fail-stop). A round of one file
    /// is always an `fdatasync`. Measured slower than `file` on the reference machine (2 busy
    /// CPUs): BENCHMARKS.md; log-store/DESIGN.md, "What a commit round costs with several
    /// shards".
    #[arg(long, value_enum, default_value_t = FsyncScope::File)]
    pub fsync_scope: FsyncScope,

    /// Microseconds a shard's next group commit may wait, after one that answered several
    /// publishes, for that many new publishes (the publishers it answered, coming back), and
    /// never longer than the commit it follows took. Without it sequential publishers split
    /// into two halves that take turns, each commit covering half of them. One sequential
    /// publisher is never held; 0 = never hold. Only under `--fsync group` (or `always`) with
    /// `--fsync-scope file`: an interval batches already, and holds ending apart would split a
    /// `syncfs` round. Only publishes count (MCP records wait for a hold like any record).
    /// BENCHMARKS.md, "Session 17".
    #[arg(long, default_value_t = 1_000)]
    pub group_commit_hold_us_max: u64,

    /// TCP_NOTSENT_LOWAT on subscriber sockets: unsent bytes the kernel may hold per subscriber;
    /// the rest of a slow subscriber's backlog stays in the log.
    #[arg(long, default_value_t = 64 * 1024)]
    pub notsent_lowat_bytes: u32,

    /// Open client connections across all cores; above it new connections get 503 and are closed.
    #[arg(long, default_value_t = 10_000)]
    pub connections_max: usize,

    /// Bytes of a request's line + headers; above it: 431.
    #[arg(long, default_value_t = 8 * 1024)]
    pub header_bytes_max: usize,

    /// Header fields per request; above it: 431.
    #[arg(long, default_value_t = 64)]
    pub header_count_max: usize,

    /// Bytes of one event's data (the body of a single publish); above it: 413.
    #[arg(long, default_value_t = 64 * 1024)]
    pub event_bytes_max: usize,

    /// Bytes of a batch publish body; above it: 413.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub batch_bytes_max: usize,

    /// Seconds a keep-alive connection may sit idle between requests before it is closed.
    #[arg(long, default_value_t = 60)]
    pub idle_timeout_secs: u64,

    /// Seconds a client has to send a complete request head once it started one (slow-loris).
    #[arg(long, default_value_t = 10)]
    pub header_timeout_secs: u64,

    /// Seconds a client has to send the whole body of an API request (publish, batch) once its
    /// head is complete, however it trickles it in; past it: 408 and the connection closes.
    /// (`/mcp` bodies keep the header timeout.)
    #[arg(long, default_value_t = 30)]
    pub body_timeout_secs: u64,

    /// Seconds a disconnected subscriber's unconfirmed send window is kept for an aligned resume.
    #[arg(long, default_value_t = 30)]
    pub resume_grace_secs: u64,

    /// Disconnected subscribers' windows kept per stream for aligned resumes (oldest dropped
    /// first). 0 = never park.
    #[arg(long, default_value_t = 64)]
    pub parked_windows_per_stream_max: usize,

    /// Events a subscriber may fall behind the stream's tail before it gets `event: truncated`
    /// and is closed.
    #[arg(long, default_value_t = 1_000_000)]
    pub lag_events_max: u64,

    /// Seconds between `:` keep-alive comments on an idle subscription.
    #[arg(long, default_value_t = 15)]
    pub keepalive_secs: u64,

    /// Milliseconds sent in the SSE `retry:` line of every subscription.
    #[arg(long, default_value_t = 1000)]
    pub retry_ms: u64,

    /// MCP front flags (`--upstream-cmd` turns it on).
    #[command(flatten)]
    pub mcp: crate::mcp::config::McpArgs,

    /// Bytes of answers a keep-alive connection may have queued (not yet taken by the kernel)
    /// before the gateway stops reading its further pipelined requests; reading resumes as the
    /// client drains them. Bounds what a client that pipelines without reading can make the
    /// gateway hold.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub pipeline_answer_bytes_max: usize,

    /// Also export one floor / tail / visible-tail series per stream in `/metrics` (off: only
    /// aggregates, so stream names — which may be private — are not exported). MCP streams are
    /// never listed: their names carry session IDs.
    #[arg(long)]
    pub metrics_per_stream: bool,

    /// With --metrics-per-stream: at most this many streams' series per core.
    #[arg(long, default_value_t = 1000)]
    pub metrics_per_stream_max: usize,

    /// Bytes handed to the kernel in one sendmsg to a subscriber (at most 1024 iovecs).
    #[arg(long, default_value_t = 256 * 1024)]
    pub send_bytes_max: usize,

    /// Testing aid: only the first N cores open a listener (0 = all), so connections that land
    /// there for streams owned elsewhere exercise the cross-core handoff.
    #[arg(long, default_value_t = 0, hide = true)]
    pub listen_cores_max: usize,

    /// Address of the admin listener: `/metrics` and `/healthz` only, served by a small thread
    /// of its own (not a reactor). Keep it on loopback or a private network. Port 0 picks a
    /// free port, printed as "admin listener on <addr>".
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub admin_listen: SocketAddr,

    /// Admin connections served at once (a thread each); above it a new one is closed at once.
    #[arg(long, default_value_t = 64)]
    pub admin_connections_max: usize,

    /// Seconds an admin client has, in total, to send its request head and take the answer,
    /// however it trickles its bytes; past it the connection is closed.
    #[arg(long, default_value_t = 5)]
    pub admin_timeout_secs: u64,

    /// Allow a `--listen` address other than loopback with no authentication configured (no
    /// JWT key and no anonymous pattern). Without it such a start is refused.
    #[arg(long)]
    pub insecure_no_auth: bool,

    /// A browser origin (`https://app.example.com`) allowed to use the API (CORS; repeatable).
    /// A request carrying any other `Origin` is refused with 403.
    #[arg(long = "cors-allow-origin", value_name = "ORIGIN")]
    pub cors_allow_origins: Vec<String>,

    #[command(flatten)]
    pub auth: AuthArgs,

    #[command(flatten)]
    pub cluster: crate::clustering::ClusterArgs,

    /// PEM certificate chain for TLS on --listen (with --tls-key-file). SIGHUP reloads both
    /// files: new handshakes use the new pair, established connections are kept.
    #[arg(long, value_name = "PATH", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key for --tls-cert-file.
    #[arg(long, value_name = "PATH", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,

    /// Seconds a TLS client has to complete its handshake (slow-loris on the handshake).
    #[arg(long, default_value_t = 10)]
    pub tls_handshake_timeout_secs: u64,

    /// Where a TLS subscriber's records are sealed once its handshake is done. `auto`: the
    /// kernel (`TCP_ULP "tls"`, `TLS_TX`; sends then go straight from the mapped log, as in the
    /// clear) when it takes the keys, else the gateway's own record layer; the first refusal of
    /// the `tls` ULP (no kernel TLS) makes every later subscriber use the record layer at once.
    /// `off`: always the record layer. Handshakes and answers are rustls' either way.
    #[arg(long, value_enum, default_value_t = TlsKernel::Auto)]
    pub tls_kernel: TlsKernel,

    /// Streams (across all shards, not counting removed ones) before a create is refused with
    /// 507 `streams_exhausted`.
    #[arg(long, default_value_t = 100_000)]
    pub streams_max: u64,

    /// Streams one subject's publishes may create (a token's issuer and `sub`; anonymous
    /// requests and tokens without `sub` count as one subject per source address) before a
    /// create is refused with 429 `subject_quota`. 0 = a tenth of --streams-max.
    #[arg(long, default_value_t = 0)]
    pub streams_per_subject_max: u64,

    /// Seconds a publish's `Idempotency-Key` is remembered: a repeat with the same key on the
    /// same stream within it stores nothing and gets the original IDs (`Idempotent-Replay:
    /// true`); the same key with another body gets 422 `idempotency_key_reused`.
    #[arg(long, default_value_t = 600)]
    pub idempotency_window_secs: u64,

    /// `Idempotency-Key`s remembered per stream (the oldest is forgotten first).
    #[arg(long, default_value_t = 1_000)]
    pub idempotency_keys_per_stream_max: usize,

    /// `Idempotency-Key`s remembered in total (split evenly over the cores; the oldest is
    /// forgotten first).
    #[arg(long, default_value_t = 100_000)]
    pub idempotency_keys_max: usize,

    /// Seconds a stream with no retained events and no subscribers is kept before it is
    /// removed (its name is free again; its old IDs are refused as another stream's). 0 = never.
    #[arg(long, default_value_t = 3600)]
    pub stream_idle_expire_secs: u64,

    /// Bytes of request bodies being received, across all connections of the process, beyond
    /// each connection's head buffer; past it, connections that need more wait (reads pause
    /// and TCP pushes back) until others finish.
    #[arg(long, default_value_t = 256 * 1024 * 1024)]
    pub request_buffer_bytes_max: u64,

    /// Open connections from one IP address (all cores); above it new ones get 503 and are
    /// closed. Behind a proxy every client shares its address: raise this there. 0 = no limit.
    #[arg(long, default_value_t = 4096)]
    pub connections_per_ip_max: u32,

    /// Disable SO_TIMESTAMPING TX_ACK confirmation and use SIOCOUTQ accounting only.
    #[arg(long, default_value_t = false)]
    pub no_tx_timestamps: bool,

    /// Milliseconds between TX ACK timestamp requests on one subscriber: a send asks the kernel
    /// for an ACK timestamp only when the previous one was answered and this long has passed
    /// (one ACK confirms every byte before it). 0 = on every send once the previous request
    /// was answered. Subscribers that confirm by SIOCOUTQ instead (TLS, or a kernel refusing
    /// the timestamps) read it at a send completion at most this often. Bytes sent in between
    /// are confirmed by the next answered request or reading, by SIOCOUTQ at the 100 ms tick,
    /// or at disconnect; a longer interval trades a little send-window memory for fewer
    /// wake-ups and system calls.
    #[arg(long, default_value_t = 20)]
    pub tx_ack_interval_ms: u64,

    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

/// Authentication flags (the `auth` crate verifies; `log-store`-style units in names).
#[derive(Debug, Clone, clap::Args)]
pub struct AuthArgs {
    /// File holding an HS256 secret (at least 32 bytes; repeatable, for rotation).
    #[arg(long = "jwt-hs256-secret-file", value_name = "PATH")]
    pub jwt_hs256_secret_files: Vec<PathBuf>,

    /// PEM public key (RSA → RS256, EC P-256 → ES256, Ed25519 → EdDSA; repeatable, for
    /// rotation). A token's `alg` must match a configured key's.
    #[arg(long = "jwt-public-key-file", value_name = "PATH")]
    pub jwt_public_key_files: Vec<PathBuf>,

    /// Required `iss` claim.
    #[arg(long)]
    pub jwt_issuer: Option<String>,

    /// Required `aud` claim.
    #[arg(long)]
    pub jwt_audience: Option<String>,

    /// Cookie that may carry the token (browser `EventSource` with credentials).
    #[arg(long)]
    pub jwt_cookie_name: Option<String>,

    /// Accept the token from `?access_token=` (URLs get logged by proxies: off by default).
    #[arg(long)]
    pub jwt_allow_query_token: bool,

    /// Verified tokens cached per core until their `exp`.
    #[arg(long, default_value_t = 10_000)]
    pub jwt_cache_entries_max: usize,

    /// Refuse (401 `invalid_token`) a token whose `exp` is more than this many seconds away
    /// when it is verified: caps how long a leaked token stays usable. 0 = no bound.
    #[arg(long, default_value_t = 0)]
    pub jwt_lifetime_max_secs: u64,

    /// JWKS document (RFC 7517) to take public keys from, by `kid` (repeatable): https://, or
    /// http:// to a loopback host. Fetched at start and every --jwt-jwks-refresh-secs.
    #[arg(long = "jwt-jwks-url", value_name = "URL")]
    pub jwt_jwks_urls: Vec<String>,

    /// Seconds between two fetches of a JWKS URL that works.
    #[arg(long, default_value_t = 300)]
    pub jwt_jwks_refresh_secs: u64,

    /// Least seconds between two fetches of a JWKS URL caused by tokens with an unknown `kid`,
    /// and between retries of a URL that failed.
    #[arg(long, default_value_t = 10)]
    pub jwt_jwks_refetch_min_secs: u64,

    /// Bytes a JWKS document may have; a larger one is a failed fetch.
    #[arg(long, default_value_t = 256 * 1024)]
    pub jwt_jwks_bytes_max: u64,

    /// Seconds one JWKS fetch may take in all (connect, TLS, answer, body).
    #[arg(long, default_value_t = 10)]
    pub jwt_jwks_timeout_secs: u64,

    /// PEM file of the certificate authorities https:// JWKS URLs are checked against, instead
    /// of the system's roots (repeatable; e.g. an identity provider behind a private CA).
    #[arg(long = "jwt-jwks-ca-file", value_name = "PATH")]
    pub jwt_jwks_ca_files: Vec<PathBuf>,

    /// Accept http:// JWKS URLs to any host (not only loopback): only where the network
    /// itself is trusted (a service mesh's mTLS sidecar).
    #[arg(long)]
    pub jwt_jwks_insecure_http: bool,

    /// Streams anyone may subscribe to without a token (exact name, or `*` wildcards;
    /// repeatable).
    #[arg(long = "anonymous-subscribe", value_name = "PATTERN")]
    pub anonymous_subscribe: Vec<String>,

    /// Streams anyone may publish to (and delete) without a token (repeatable).
    #[arg(long = "anonymous-publish", value_name = "PATTERN")]
    pub anonymous_publish: Vec<String>,
}

impl AuthArgs {
    pub fn settings(&self) -> auth::AuthSettings {
        auth::AuthSettings {
            hs256_secret_files: self.jwt_hs256_secret_files.clone(),
            public_key_files: self.jwt_public_key_files.clone(),
            issuer: self.jwt_issuer.clone(),
            audience: self.jwt_audience.clone(),
            cookie_name: self.jwt_cookie_name.clone(),
            query_token: self.jwt_allow_query_token,
            anonymous_subscribe: self.anonymous_subscribe.clone(),
            anonymous_publish: self.anonymous_publish.clone(),
            cache_entries_max: self.jwt_cache_entries_max,
            lifetime_max_secs: (self.jwt_lifetime_max_secs > 0)
                .then_some(self.jwt_lifetime_max_secs),
            jwks_urls: self.jwt_jwks_urls.clone(),
        }
    }

    /// Whether a JWT key source is configured: key files or a JWKS URL (real
    /// authentication, unlike anonymous patterns).
    pub fn keys_configured(&self) -> bool {
        self.keys_from_files() || !self.jwt_jwks_urls.is_empty()
    }

    /// The `--jwt-jwks-*` flags for the fetcher.
    pub fn jwks(&self) -> crate::jwks::JwksSettings {
        crate::jwks::JwksSettings {
            urls: self.jwt_jwks_urls.clone(),
            refresh_secs: self.jwt_jwks_refresh_secs,
            refetch_min_secs: self.jwt_jwks_refetch_min_secs,
            bytes_max: self.jwt_jwks_bytes_max,
            timeout_secs: self.jwt_jwks_timeout_secs,
            ca_files: self.jwt_jwks_ca_files.clone(),
            key_files: self.keys_from_files(),
        }
    }

    /// Whether a key file is configured.
    pub fn keys_from_files(&self) -> bool {
        !(self.jwt_hs256_secret_files.is_empty() && self.jwt_public_key_files.is_empty())
    }

    /// Whether any access control is configured.
    pub fn configured(&self) -> bool {
        self.keys_configured()
            || !(self.anonymous_subscribe.is_empty() && self.anonymous_publish.is_empty())
    }
}

/// A flag combination that cannot work, named exactly.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// `--fsync` is not one of the accepted forms.
    BadFsync(String),
    /// A limit that must be positive is zero.
    Zero(&'static str),
    /// `--send-bytes-max` below the largest single event would stall a subscriber.
    SendBytesBelowEvent,
    /// A limit above what the gateway can represent (flag, largest accepted value).
    TooLarge(&'static str, u64),
    /// An MCP front flag is invalid (the message names it).
    Mcp(String),
    /// A non-loopback `--listen` with no authentication and no `--insecure-no-auth`.
    ExposedWithoutAuth(SocketAddr),
    /// A non-loopback `--listen` with the MCP front on, no JWT key (anonymous patterns never
    /// open `/mcp`) and no `--insecure-no-auth`.
    McpExposedWithoutKeys(SocketAddr),
    /// A `--cors-allow-origin` that is not `scheme://host[:port]`.
    BadOrigin(String),
    /// `--request-buffer-bytes-max` below the largest body one request may have.
    RequestBufferBelowBody(u64),
    /// A cluster-mode flag is invalid or combined with what cluster mode lacks.
    Cluster(String),
    /// A `--jwt-jwks-url` that is not accepted (the message names it and why).
    Jwks(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::BadFsync(s) => {
                write!(
                    f,
                    "--fsync {s:?}: expected never, group, always or interval:<ms>"
                )
            }
            ConfigError::Zero(flag) => write!(f, "{flag} must be greater than 0"),
            ConfigError::SendBytesBelowEvent => {
                write!(f, "--send-bytes-max must be at least --event-bytes-max")
            }
            ConfigError::TooLarge(flag, max) => write!(f, "{flag} must be at most {max}"),
            ConfigError::Mcp(m) | ConfigError::Cluster(m) | ConfigError::Jwks(m) => {
                write!(f, "{m}")
            }
            ConfigError::ExposedWithoutAuth(a) => write!(
                f,
                "--listen {a} is not loopback and no authentication is configured: give \
                 --jwt-hs256-secret-file / --jwt-public-key-file / --jwt-jwks-url (or \
                 --anonymous-subscribe / \
                 --anonymous-publish patterns), or --insecure-no-auth to expose it open"
            ),
            ConfigError::McpExposedWithoutKeys(a) => write!(
                f,
                "--listen {a} is not loopback and the MCP front is on with no JWT key: give \
                 --jwt-hs256-secret-file / --jwt-public-key-file / --jwt-jwks-url (tokens then need \
                 {{\"gateway\": {{\"mcp\": true}}}}; anonymous patterns never open the MCP \
                 endpoint), or --insecure-no-auth to expose it open"
            ),
            ConfigError::RequestBufferBelowBody(b) => write!(
                f,
                "--request-buffer-bytes-max must be at least the largest request body \
                 (--batch-bytes-max plus 2 × --header-bytes-max for a chunked body's head and \
                 framing, or --mcp-body-bytes-max): {b}"
            ),
            ConfigError::BadOrigin(o) => write!(
                f,
                "--cors-allow-origin {o:?}: expected an origin like https://app.example.com \
                 (scheme://host[:port], no path, no trailing slash)"
            ),
        }
    }
}

/// The largest `--admin-timeout-secs`.
const ADMIN_TIMEOUT_SECS_MAX: u64 = 86_400;

impl Config {
    /// Checks flag values that clap's types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(f) = &self.fsync {
            parse_fsync(f)?;
        }
        self.mcp.validate().map_err(ConfigError::Mcp)?;
        self.cluster.validate().map_err(ConfigError::Cluster)?;
        self.validate_nonzero()?;
        if self.send_bytes_max < self.event_bytes_max {
            return Err(ConfigError::SendBytesBelowEvent);
        }
        let body_max = self.body_buffer_bytes_min();
        if self.request_buffer_bytes_max < body_max {
            return Err(ConfigError::RequestBufferBelowBody(body_max));
        }
        let exposed = !self.listen.ip().is_loopback() && !self.insecure_no_auth;
        if exposed && !self.auth.configured() {
            return Err(ConfigError::ExposedWithoutAuth(self.listen));
        }
        if exposed && self.mcp.enabled() && !self.auth.keys_configured() {
            return Err(ConfigError::McpExposedWithoutKeys(self.listen));
        }
        for url in &self.auth.jwt_jwks_urls {
            crate::jwks::check_url(url, self.auth.jwt_jwks_insecure_http)
                .map_err(ConfigError::Jwks)?;
        }
        if let Some(o) = self.cors_allow_origins.iter().find(|o| !valid_origin(o)) {
            return Err(ConfigError::BadOrigin(o.clone()));
        }
        // One core holds at most this many connections in its slot table (the slot number is
        // 24 bits of every io_uring user_data).
        let slots_max = crate::uring::SLOTS_MAX as u64 - 1;
        if self.connections_max as u64 > slots_max {
            return Err(ConfigError::TooLarge("--connections-max", slots_max));
        }
        // An admin deadline is a point in time: keep it representable (a day is plenty).
        if self.admin_timeout_secs > ADMIN_TIMEOUT_SECS_MAX {
            let max = ADMIN_TIMEOUT_SECS_MAX;
            return Err(ConfigError::TooLarge("--admin-timeout-secs", max));
        }
        Ok(())
    }

    /// Limits for which 0 makes no sense.
    fn validate_nonzero(&self) -> Result<(), ConfigError> {
        for (v, name) in [
            (self.connections_max as u64, "--connections-max"),
            (self.header_bytes_max as u64, "--header-bytes-max"),
            (self.header_count_max as u64, "--header-count-max"),
            (self.event_bytes_max as u64, "--event-bytes-max"),
            (self.batch_bytes_max as u64, "--batch-bytes-max"),
            (self.idle_timeout_secs, "--idle-timeout-secs"),
            (self.header_timeout_secs, "--header-timeout-secs"),
            (self.body_timeout_secs, "--body-timeout-secs"),
            (self.admin_connections_max as u64, "--admin-connections-max"),
            (self.admin_timeout_secs, "--admin-timeout-secs"),
            (self.keepalive_secs, "--keepalive-secs"),
            (self.lag_events_max, "--lag-events-max"),
            (self.send_bytes_max as u64, "--send-bytes-max"),
            (
                self.pipeline_answer_bytes_max as u64,
                "--pipeline-answer-bytes-max",
            ),
            (self.streams_max, "--streams-max"),
            (self.idempotency_window_secs, "--idempotency-window-secs"),
            (
                self.idempotency_keys_per_stream_max as u64,
                "--idempotency-keys-per-stream-max",
            ),
            (self.idempotency_keys_max as u64, "--idempotency-keys-max"),
            (
                self.tls_handshake_timeout_secs,
                "--tls-handshake-timeout-secs",
            ),
            (self.request_buffer_bytes_max, "--request-buffer-bytes-max"),
            (
                self.auth.jwt_cache_entries_max as u64,
                "--jwt-cache-entries-max",
            ),
            (self.auth.jwt_jwks_refresh_secs, "--jwt-jwks-refresh-secs"),
            (
                self.auth.jwt_jwks_refetch_min_secs,
                "--jwt-jwks-refetch-min-secs",
            ),
            (self.auth.jwt_jwks_bytes_max, "--jwt-jwks-bytes-max"),
            (self.auth.jwt_jwks_timeout_secs, "--jwt-jwks-timeout-secs"),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        Ok(())
    }

    /// `--streams-per-subject-max`, where 0 is a tenth of `--streams-max` (at least 1).
    pub fn streams_per_subject_max(&self) -> u64 {
        match self.streams_per_subject_max {
            0 => (self.streams_max / 10).max(1),
            n => n,
        }
    }

    /// The least `--request-buffer-bytes-max` that admits every body one request may have.
    /// A chunked API body's buffer holds its head, the body and one line of framing
    /// (`proto::conn::chunked_body`): head and line are bounded by `--header-bytes-max`.
    fn body_buffer_bytes_min(&self) -> u64 {
        let mcp_body = if self.mcp.enabled() {
            self.mcp.mcp_body_bytes_max
        } else {
            0
        };
        let framing = self.header_bytes_max.saturating_mul(2);
        let api_body = (self.batch_bytes_max.max(self.event_bytes_max)).saturating_add(framing);
        api_body.max(mcp_body) as u64
    }

    /// The fsync policy as the log store takes it.
    pub fn fsync_policy(&self) -> log_store::FsyncPolicy {
        match &self.fsync {
            Some(f) => parse_fsync(f).expect("validated at start"),
            None if self.cluster.enabled() => log_store::FsyncPolicy::Never,
            None => log_store::FsyncPolicy::Group,
        }
    }
}

/// `scheme://host[:port]` as a browser serializes an origin (RFC 6454 §6.2).
fn valid_origin(o: &str) -> bool {
    let Some((scheme, rest)) = o.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https")
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', ' ', '*'])
}

fn parse_fsync(s: &str) -> Result<log_store::FsyncPolicy, ConfigError> {
    s.parse::<log_store::FsyncPolicy>()
        .map_err(|_| ConfigError::BadFsync(s.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        let c = Config::parse_from(["gateway"]);
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn rejects_bad_values() {
        let c = Config::parse_from(["gateway", "--fsync", "sometimes"]);
        assert_eq!(c.validate(), Err(ConfigError::BadFsync("sometimes".into())));
        let c = Config::parse_from(["gateway", "--header-bytes-max", "0"]);
        assert_eq!(c.validate(), Err(ConfigError::Zero("--header-bytes-max")));
        let c = Config::parse_from(["gateway", "--connections-max", "16777216"]);
        assert_eq!(
            c.validate(),
            Err(ConfigError::TooLarge("--connections-max", 16_777_215))
        );
        let c = Config::parse_from(["gateway", "--connections-max", "16777215"]);
        assert_eq!(c.validate(), Ok(()));
        let c = Config::parse_from(["gateway", "--admin-timeout-secs", "86401"]);
        let too_long = ConfigError::TooLarge("--admin-timeout-secs", 86_400);
        assert_eq!(c.validate(), Err(too_long));
        for zero in [
            "--body-timeout-secs",
            "--admin-timeout-secs",
            "--admin-connections-max",
        ] {
            let c = Config::parse_from(["gateway", zero, "0"]);
            assert_eq!(c.validate(), Err(ConfigError::Zero(zero)));
        }
        // A chunked body's head and framing must fit the body budget too.
        let c = Config::parse_from(["gateway", "--request-buffer-bytes-max", "4194304"]);
        let need = 4 * 1024 * 1024 + 2 * 8192;
        assert_eq!(c.validate(), Err(ConfigError::RequestBufferBelowBody(need)));
    }

    #[test]
    fn exposed_listener_needs_auth_or_the_insecure_flag() {
        let c = Config::parse_from(["gateway", "--listen", "0.0.0.0:8080"]);
        assert_eq!(
            c.validate(),
            Err(ConfigError::ExposedWithoutAuth(
                "0.0.0.0:8080".parse().unwrap()
            ))
        );
        let c = Config::parse_from(["gateway", "--listen", "0.0.0.0:8080", "--insecure-no-auth"]);
        assert_eq!(c.validate(), Ok(()));
        let c = Config::parse_from([
            "gateway",
            "--listen",
            "[::]:8080",
            "--anonymous-subscribe",
            "public-*",
        ]);
        assert_eq!(c.validate(), Ok(()));
        let c = Config::parse_from(["gateway", "--listen", "[::1]:8080"]);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn a_jwks_url_is_real_authentication_and_is_checked() {
        let jwks = "https://idp.example/jwks.json";
        let exposed = [
            "gateway",
            "--listen",
            "0.0.0.0:8080",
            "--jwt-jwks-url",
            jwks,
        ];
        assert_eq!(Config::parse_from(exposed).validate(), Ok(()));
        let with_mcp = [&exposed[..], &["--upstream-cmd", "cat"]].concat();
        assert_eq!(Config::parse_from(with_mcp).validate(), Ok(()));
        let http = ["gateway", "--jwt-jwks-url", "http://idp.example/jwks.json"];
        let err = Config::parse_from(http).validate().unwrap_err();
        assert!(
            matches!(&err, ConfigError::Jwks(m) if m.contains("loopback")),
            "{err}"
        );
        let insecure = [&http[..], &["--jwt-jwks-insecure-http"]].concat();
        assert_eq!(Config::parse_from(insecure).validate(), Ok(()));
        for zero in [
            "--jwt-jwks-refresh-secs",
            "--jwt-jwks-refetch-min-secs",
            "--jwt-jwks-bytes-max",
            "--jwt-jwks-timeout-secs",
        ] {
            let c = Config::parse_from(["gateway", zero, "0"]);
            assert_eq!(c.validate(), Err(ConfigError::Zero(zero)));
        }
    }

    #[test]
    fn origins_are_checked() {
        for bad in [
            "example.com",
            "https://a.example/",
            "https://*.example",
            "ftp://a",
        ] {
            let c = Config::parse_from(["gateway", "--cors-allow-origin", bad]);
            assert_eq!(
                c.validate(),
                Err(ConfigError::BadOrigin(bad.into())),
                "{bad}"
            );
        }
        let c = Config::parse_from(["gateway", "--cors-allow-origin", "http://127.0.0.2:8000"]);
        assert_eq!(c.validate(), Ok(()));
    }
}

/// `--tls-kernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsKernel {
    Auto,
    Off,
}

/// `--fsync-scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FsyncScope {
    File,
    Filesystem,
}
