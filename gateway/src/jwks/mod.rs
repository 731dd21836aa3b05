//! JWKS (`--jwt-jwks-url`): fetches each JWKS document with a blocking HTTP client (`ureq`, on
//! rustls with the system's roots or `--jwt-jwks-ca-file`), parses it (`auth::jwks`), and
//! installs a new verifier through `auth::Keys` — the same way SIGHUP installs reloaded key
//! files — whenever a key set changes. Every fetch after the first runs on the thread
//! `jwt-jwks`, never on a reactor core; a core that meets an unknown `kid` only signals the
//! thread (a channel of one slot), and `schedule.rs` bounds the fetches that causes.
//!
//! A failed fetch (connection, timeout, status other than 200, a document over
//! `--jwt-jwks-bytes-max`, a document `auth::jwks` refuses) keeps the URL's last good set and is
//! logged with the URL (never a token: the thread sees none). At start each URL is fetched
//! once before the cores start: when every key source fails (each JWKS URL, and there is no
//! key file) the gateway exits with each URL's reason; when some source works it starts, logs
//! each failed URL as an error and retries it every `--jwt-jwks-refetch-min-secs`.
#![forbid(unsafe_code)]

pub mod schedule;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use auth::jwks::JwkSet;
use crossbeam::channel::{Receiver, RecvTimeoutError};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use ureq::tls::{Certificate, RootCerts, TlsConfig};

use crate::metrics::jwks::JWKS;
use schedule::{Schedule, Why};

/// The media types asked for (RFC 7517 §8.5, and what most providers serve).
const ACCEPT: &str = "application/jwk-set+json, application/json";

/// The `--jwt-jwks-*` flags, as the fetcher takes them (`config::AuthArgs::jwks`).
#[derive(Clone, Debug, Default)]
pub struct JwksSettings {
    /// `--jwt-jwks-url`, in flag order.
    pub urls: Vec<String>,
    pub refresh_secs: u64,
    pub refetch_min_secs: u64,
    pub bytes_max: u64,
    pub timeout_secs: u64,
    /// `--jwt-jwks-ca-file`: empty for the system's roots.
    pub ca_files: Vec<PathBuf>,
    /// Whether a key file is configured too (then a start with every URL failing goes on).
    pub key_files: bool,
}

/// Checks one `--jwt-jwks-url`: `https://`, or `http://` only to a loopback host (127.0.0.0/8,
/// `[::1]`, `localhost`) unless `insecure_http`; no user information (it would be logged).
pub fn check_url(url: &str, insecure_http: bool) -> Result<(), String> {
    let bad = |why: &str| Err(format!("--jwt-jwks-url {url:?}: {why}"));
    let Ok(uri) = url.parse::<ureq::http::Uri>() else {
        return bad("not a URL");
    };
    let Some(host) = uri.host() else {
        return bad("no host");
    };
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return bad("user information in the URL is not supported (it would be logged)");
    }
    match uri.scheme_str() {
        Some("https") => Ok(()),
        Some("http") if insecure_http || is_loopback(host) => Ok(()),
        Some("http") => bad(
            "http:// is accepted only to a loopback host: anyone on the path could swap the \
             keys and mint tokens. Use https://, or --jwt-jwks-insecure-http where the network \
             itself is trusted (e.g. a service mesh's mTLS sidecar)",
        ),
        _ => bad("expected an https:// URL"),
    }
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || bare.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
}

/// One URL and the client that fetches it.
struct Source {
    url: String,
    agent: ureq::Agent,
    set: Arc<JwkSet>,
    /// The last fetch failed (its error is logged once, then rate-limited).
    failing: bool,
}

/// The fetching thread's state.
struct Fetcher {
    sources: Vec<Source>,
    bytes_max: u64,
    keys: Arc<auth::Keys>,
}

/// Fetches every `--jwt-jwks-url` once, installs the sets that loaded, then starts the
/// `jwt-jwks` thread that keeps them fresh. Nothing to do without a JWKS URL. An error when
/// no key source works at all (no key file, and every URL failed), naming each URL's reason.
pub fn start(a: &JwksSettings, keys: &Arc<auth::Keys>) -> Result<(), String> {
    if a.urls.is_empty() {
        return Ok(());
    }
    let roots = roots(&a.urls, &a.ca_files)?;
    let timeout = Duration::from_secs(a.timeout_secs);
    let sources = a.urls.iter().map(|url| Source {
        agent: agent(url, roots.clone(), timeout),
        url: url.clone(),
        set: Arc::default(),
        failing: false,
    });
    let mut f = Fetcher {
        sources: sources.collect(),
        bytes_max: a.bytes_max,
        keys: keys.clone(),
    };
    let started = Instant::now();
    let first: Vec<Result<(), String>> = (0..f.sources.len()).map(|i| f.refresh(i)).collect();
    first_fetch_verdict(&f, &first, a.key_files)?;
    let ok: Vec<bool> = first.iter().map(Result::is_ok).collect();
    let schedule = Schedule::new(
        a.refresh_secs.saturating_mul(1000),
        a.refetch_min_secs.saturating_mul(1000),
        &ok,
        0,
    );
    let (tx, rx) = crossbeam::channel::bounded(1);
    keys.on_unknown_kid(move || {
        JWKS.unknown_kid_total.fetch_add(1, Relaxed);
        let _ = tx.try_send(());
    });
    std::thread::Builder::new()
        .name("jwt-jwks".into())
        .spawn(move || f.run(schedule, &rx, started))
        .map_err(|e| format!("jwt-jwks thread: {e}"))?;
    Ok(())
}

/// After the first fetches: an error if no key source works, else the failures summed up in
/// one error line (each was logged with its URL as it happened).
fn first_fetch_verdict(
    f: &Fetcher,
    first: &[Result<(), String>],
    key_files: bool,
) -> Result<(), String> {
    let failed: Vec<String> = f
        .sources
        .iter()
        .zip(first)
        .filter_map(|(s, r)| {
            r.as_ref()
                .err()
                .map(|e| format!("--jwt-jwks-url {}: {e}", s.url))
        })
        .collect();
    if failed.len() == f.sources.len() && !key_files {
        return Err(format!(
            "no JWT key source works (no key file, and every JWKS fetch failed): {}",
            failed.join("; ")
        ));
    }
    if !failed.is_empty() {
        tracing::error!(
            "{} of {} JWKS URLs failed at start: starting with the other key sources; each \
             failed URL is retried every --jwt-jwks-refetch-min-secs (tokens of its keys are \
             refused until then)",
            failed.len(),
            f.sources.len()
        );
    }
    Ok(())
}

impl Fetcher {
    /// The thread: waits for the next due fetch or an unknown-kid signal, fetches, repeats.
    fn run(mut self, mut schedule: Schedule, rx: &Receiver<()>, started: Instant) {
        let now_ms = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        loop {
            let wait = Duration::from_millis(schedule.wait_ms(now_ms()));
            match rx.recv_timeout(wait) {
                Ok(()) => schedule.note_unknown_kid(),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            let now = now_ms();
            for (i, why) in schedule.due(now) {
                if why == Why::UnknownKid {
                    JWKS.fetches_unknown_kid_total.fetch_add(1, Relaxed);
                }
                let ok = self.refresh(i).is_ok();
                schedule.fetched(i, now_ms(), ok);
            }
        }
    }

    /// Fetches URL `i` and installs its keys if they changed. A failure keeps the last set.
    fn refresh(&mut self, i: usize) -> Result<(), String> {
        let s = &mut self.sources[i];
        let got = fetch(&s.agent, &s.url, self.bytes_max)
            .and_then(|doc| auth::jwks::parse(&doc).map_err(|e| format!("refused: {e}")));
        let (set, skipped) = match got {
            Ok(v) => v,
            Err(e) => {
                note_failure(s, &e);
                return Err(e);
            }
        };
        if std::mem::replace(&mut s.failing, false) {
            JWKS.urls_failing.fetch_sub(1, Relaxed);
            tracing::info!(url = %s.url, "JWKS fetch works again");
        }
        if *s.set == set {
            JWKS.fetches_unchanged_total.fetch_add(1, Relaxed);
            return Ok(());
        }
        for k in &skipped {
            tracing::warn!(url = %s.url, "JWKS key skipped: {k}");
        }
        tracing::info!(url = %s.url, keys = ?set, "JWKS key set in use");
        s.set = Arc::new(set);
        self.install();
        JWKS.fetches_changed_total.fetch_add(1, Relaxed);
        Ok(())
    }

    /// A new verifier: the current one (its key files, as SIGHUP last loaded them) with every
    /// URL's set.
    fn install(&self) {
        let sets: Vec<Arc<JwkSet>> = self.sources.iter().map(|s| s.set.clone()).collect();
        let keys = sets.iter().map(|s| s.len() as u64).sum();
        let _ = self
            .keys
            .update(|cur| Ok::<_, ()>(Some(cur.with_jwks(sets))));
        JWKS.keys.store(keys, Relaxed);
    }
}

/// A failed fetch of `s`: counted, and logged with its URL (an error when the URL worked
/// until now, then at most once a minute while it keeps failing).
fn note_failure(s: &mut Source, e: &str) {
    JWKS.fetches_failed_total.fetch_add(1, Relaxed);
    if std::mem::replace(&mut s.failing, true) {
        crate::warn_limited!(
            url = %s.url,
            "JWKS fetch failed again (its last good key set, if any, stays in use): {e}"
        );
        return;
    }
    JWKS.urls_failing.fetch_add(1, Relaxed);
    tracing::error!(
        url = %s.url,
        "JWKS fetch failed (its last good key set, if any, stays in use): {e}"
    );
}

/// GET `url`: the body of a 200 answer, at most `bytes_max` bytes.
fn fetch(agent: &ureq::Agent, url: &str, bytes_max: u64) -> Result<Vec<u8>, String> {
    let why = |e: ureq::Error| match e {
        ureq::Error::Timeout(_) => "no whole answer within --jwt-jwks-timeout-secs".to_owned(),
        e => e.to_string(),
    };
    let mut answer = agent
        .get(url)
        .header("Accept", ACCEPT)
        .call()
        .map_err(why)?;
    let status = answer.status();
    if status != 200 {
        return Err(format!("HTTP status {status}"));
    }
    answer
        .body_mut()
        .with_config()
        .limit(bytes_max)
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => {
                format!("the document is over --jwt-jwks-bytes-max ({bytes_max} bytes)")
            }
            e => why(e),
        })
}

/// The client of one URL. https: the system's roots, redirects only to https. http (loopback,
/// or `--jwt-jwks-insecure-http`): no redirect and no proxy (a proxy's loopback is another
/// host's). `HTTPS_PROXY` / `NO_PROXY` are honoured for https.
fn agent(url: &str, roots: Option<RootCerts>, timeout: Duration) -> ureq::Agent {
    let https = url.starts_with("https://");
    let mut b = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .user_agent(format!("gateway/{}", crate::VERSION))
        .https_only(https);
    if let Some(roots) = roots.filter(|_| https) {
        b = b.tls_config(TlsConfig::builder().root_certs(roots).build());
    } else {
        b = b.max_redirects(0).proxy(None);
    }
    b.build().into()
}

/// The certificates an https:// JWKS URL is checked against: those of `--jwt-jwks-ca-file`
/// when given (only them), else the system's roots (`rustls-native-certs`: honours
/// `SSL_CERT_FILE` and `SSL_CERT_DIR`). None when no URL is https.
fn roots(urls: &[String], ca_files: &[PathBuf]) -> Result<Option<RootCerts>, String> {
    if !urls.iter().any(|u| u.starts_with("https://")) {
        return Ok(None);
    }
    let mut certs = Vec::new();
    for f in ca_files {
        let bad = |e: &dyn std::fmt::Display| format!("--jwt-jwks-ca-file {}: {e}", f.display());
        let found = CertificateDer::pem_file_iter(f).map_err(|e| bad(&e))?;
        let before = certs.len();
        for c in found {
            certs.push(c.map_err(|e| bad(&e))?);
        }
        if certs.len() == before {
            return Err(bad(&"no PEM certificate in it"));
        }
    }
    if ca_files.is_empty() {
        let found = rustls_native_certs::load_native_certs();
        if found.certs.is_empty() {
            let why = found
                .errors
                .first()
                .map_or_else(|| "none found".to_owned(), ToString::to_string);
            return Err(format!(
                "--jwt-jwks-url: no system root certificate ({why}); set SSL_CERT_FILE or \
                 give --jwt-jwks-ca-file"
            ));
        }
        certs = found.certs;
    }
    let certs: Vec<Certificate<'static>> = certs
        .iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    Ok(Some(RootCerts::new_with_certs(&certs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        for ok in [
            "https://idp.example/.well-known/jwks.json",
            "http://127.0.0.1:8080/jwks",
            "http://127.9.9.9/jwks",
            "http://[::1]:9000/jwks",
            "http://localhost/jwks",
        ] {
            assert_eq!(check_url(ok, false), Ok(()), "{ok}");
        }
        let err = check_url("http://idp.example/jwks", false).unwrap_err();
        assert!(err.contains("loopback"), "{err}");
        assert_eq!(check_url("http://idp.example/jwks", true), Ok(()));
        let err = check_url("https://user:pw@idp.example/jwks", false).unwrap_err();
        assert!(err.contains("user information"), "{err}");
        assert!(check_url("ftp://idp.example/jwks", false).is_err());
        assert!(check_url("idp.example/jwks", false).is_err());
        assert!(check_url("not a url", false).is_err());
        assert!(check_url("http://localhost.evil.example/jwks", false).is_err());
    }
}
