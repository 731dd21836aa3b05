//! `Auth::check` on one token, uncached (cache bound 0: every call verifies the signature) and
//! cached (the second and later calls are a map lookup and a pattern match), for HS256 and
//! ES256. Keys are made by the `openssl` CLI, as in the tests.
//!
//! Run: `cargo bench -p auth --bench verify` (add `-- --measurement-time 2` for a quick look).
#![forbid(unsafe_code)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use auth::{Action, Auth, Credentials};
use common::*;
use criterion::{Criterion, criterion_group, criterion_main};
use jsonwebtoken::Algorithm;

/// Claims shaped like a real grant: a subject and a few patterns per list.
fn bench_claims() -> serde_json::Value {
    claims(
        "user-1234",
        EXP,
        &["orders.*", "audit"],
        &["orders.*", "news.*", "public"],
    )
}

fn run(c: &mut Criterion, name: &str, auth: &mut Auth, token: &str) {
    let value = bearer(token);
    let creds = Credentials {
        authorization: Some(&value),
        cookie: None,
        query: "",
    };
    assert!(
        auth.check(&creds, Action::Subscribe, "news.eu", NOW)
            .is_ok()
    );
    c.bench_function(name, |b| {
        b.iter(|| black_box(auth.check(black_box(&creds), Action::Subscribe, "news.eu", NOW)))
    });
}

fn verify(c: &mut Criterion) {
    let hs_token = sign_hs(SECRET_A, &bench_claims());
    let es_key = signing_key("ec", Algorithm::ES256);
    let es_token = sign(Algorithm::ES256, &es_key, &bench_claims());
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "a.secret", SECRET_A);
    let hs = |max: usize| {
        let secret = secret.clone();
        auth_with(move |s| {
            s.hs256_secret_files = vec![secret];
            s.cache_entries_max = max;
        })
    };
    let es = |max: usize| {
        auth_with(move |s| {
            s.public_key_files = vec![public("ec")];
            s.cache_entries_max = max;
        })
    };
    run(c, "check/hs256_uncached", &mut hs(0), &hs_token);
    run(c, "check/es256_uncached", &mut es(0), &es_token);
    run(c, "check/hs256_cached", &mut hs(16), &hs_token);
    run(c, "check/es256_cached", &mut es(16), &es_token);
}

criterion_group!(benches, verify);
criterion_main!(benches);
