//! The JWKS families (`--jwt-jwks-url`): process-wide counters the fetcher thread and the
//! cores' unknown-`kid` reports update; exported always (zero without a JWKS URL), so alert
//! rules can name them.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::family;

/// The JWKS counters of the process.
#[derive(Debug, Default)]
pub struct JwksMetrics {
    /// Fetches that installed a new key set.
    pub fetches_changed_total: AtomicU64,
    /// Fetches whose keys were those already in use.
    pub fetches_unchanged_total: AtomicU64,
    /// Fetches that failed (network, status, size, timeout, document): the last set stays.
    pub fetches_failed_total: AtomicU64,
    /// Fetches asked for by a token with an unknown `kid` (within the refetch bound).
    pub fetches_unknown_kid_total: AtomicU64,
    /// Tokens refused for a `kid` no key set knows.
    pub unknown_kid_total: AtomicU64,
    /// Usable keys over all JWKS sets in use.
    pub keys: AtomicU64,
    /// JWKS URLs whose last fetch failed.
    pub urls_failing: AtomicU64,
}

/// The process's JWKS counters.
pub static JWKS: JwksMetrics = JwksMetrics {
    fetches_changed_total: AtomicU64::new(0),
    fetches_unchanged_total: AtomicU64::new(0),
    fetches_failed_total: AtomicU64::new(0),
    fetches_unknown_kid_total: AtomicU64::new(0),
    unknown_kid_total: AtomicU64::new(0),
    keys: AtomicU64::new(0),
    urls_failing: AtomicU64::new(0),
};

/// The JWKS families.
pub(super) fn render(out: &mut String) {
    let m = &JWKS;
    family(
        out,
        "gateway_jwt_jwks_fetches_total",
        "counter",
        "JWKS fetches by result: changed (a new key set in use), unchanged, failed (the last good set stays).",
    );
    for (result, v) in [
        ("changed", &m.fetches_changed_total),
        ("unchanged", &m.fetches_unchanged_total),
        ("failed", &m.fetches_failed_total),
    ] {
        let v = v.load(Relaxed);
        let _ = writeln!(
            out,
            "gateway_jwt_jwks_fetches_total{{result=\"{result}\"}} {v}"
        );
    }
    for (name, kind, help, v) in [
        (
            "gateway_jwt_jwks_unknown_kid_fetches_total",
            "counter",
            "JWKS fetches made because a token named an unknown kid (at most one per URL per --jwt-jwks-refetch-min-secs).",
            &m.fetches_unknown_kid_total,
        ),
        (
            "gateway_jwt_unknown_kid_total",
            "counter",
            "Tokens refused because no JWKS key set knows their kid.",
            &m.unknown_kid_total,
        ),
        (
            "gateway_jwt_jwks_keys",
            "gauge",
            "Usable keys in the JWKS key sets in use (all URLs).",
            &m.keys,
        ),
        (
            "gateway_jwt_jwks_urls_failing",
            "gauge",
            "JWKS URLs whose last fetch failed (their last good key set stays in use).",
            &m.urls_failing,
        ),
    ] {
        family(out, name, kind, help);
        let _ = writeln!(out, "{name} {}", v.load(Relaxed));
    }
}
