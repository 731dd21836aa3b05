//! JWKS keys end to end through `Auth`: keys built from real generated key pairs, picked by the
//! token's `kid`; an unknown `kid` refused and reported to the gateway's hook; a new set taken
//! up through `Keys` (a new key works, a dropped key's tokens are refused); key files and JWKS
//! together; a JWKS URL whose first fetch has not happened yet.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use auth::jwks::{JwkSet, parse};
use auth::{Action, Auth, AuthSettings, Denied, Invalid, Keys, Verifier};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use jsonwebtoken::{Algorithm, Header, encode};
use serde_json::{Value, json};

const SUB: Action = Action::Subscribe;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The DER contents of the PEM file `name.pub` (or `name` when it has an extension).
fn der(file: &str) -> Vec<u8> {
    let bytes = std::fs::read(keys_dir().join(file)).unwrap();
    pem::parse(bytes).unwrap().contents().to_vec()
}

/// One DER INTEGER or SEQUENCE at the start of `d`: (contents, rest).
fn take(d: &[u8]) -> (&[u8], &[u8]) {
    let (len, at) = match d[1] {
        l if l < 0x80 => (usize::from(l), 2),
        0x81 => (usize::from(d[2]), 3),
        0x82 => (usize::from(d[2]) << 8 | usize::from(d[3]), 4),
        l => panic!("length form {l:#x}"),
    };
    (&d[at..at + len], &d[at + len..])
}

/// The public JWK of generated key `name` (rsa, ec, ec_b, ed) under `kid`.
fn jwk(name: &str, kid: &str) -> Value {
    match name {
        "rsa" => {
            let pkcs1 = der("rsa.pkcs1.pub");
            let (seq, _) = take(&pkcs1);
            let (n, rest) = take(seq);
            let (e, _) = take(rest);
            json!({"kty": "RSA", "kid": kid, "n": b64(n), "e": b64(e), "alg": "RS256"})
        }
        "ec" | "ec_b" => {
            let spki = der(&format!("{name}.pub"));
            let xy = &spki[spki.len() - 64..];
            json!({"kty": "EC", "crv": "P-256", "kid": kid, "x": b64(&xy[..32]),
                   "y": b64(&xy[32..]), "use": "sig"})
        }
        "ed" => {
            let spki = der("ed.pub");
            json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": b64(&spki[spki.len() - 32..])})
        }
        other => panic!("no JWK for {other}"),
    }
}

fn set(keys: &[Value]) -> Arc<JwkSet> {
    let doc = serde_json::to_vec(&json!({ "keys": keys })).unwrap();
    let (set, skipped) = parse(&doc).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    Arc::new(set)
}

/// A token of generated key `name` with `alg`, whose header names `kid` (or none).
fn token(name: &str, alg: Algorithm, kid: Option<&str>) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    let claims = claims("alice", EXP, &[], &["s"]);
    encode(&header, &claims, &signing_key(name, alg)).unwrap()
}

/// A verifier with one JWKS URL (no fetch: `sets` stand for what it served) and `edit`.
fn verifier(sets: Vec<Arc<JwkSet>>, edit: impl FnOnce(&mut AuthSettings)) -> Verifier {
    let mut s = AuthSettings {
        jwks_urls: sets
            .iter()
            .map(|_| "https://idp.example/jwks".into())
            .collect(),
        ..AuthSettings::default()
    };
    edit(&mut s);
    Verifier::load(&s).unwrap().with_jwks(sets)
}

/// `Keys` over `v`, and the count of unknown-kid reports its hook saw.
fn keys_with_hook(v: Verifier) -> (Arc<Keys>, Arc<AtomicU64>) {
    let keys = Arc::new(Keys::new(Arc::new(v)));
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    keys.on_unknown_kid(move || {
        s.fetch_add(1, Ordering::Relaxed);
    });
    (keys, seen)
}

#[test]
fn each_kind_of_key_verifies_by_kid() {
    let v = verifier(
        vec![set(&[jwk("rsa", "r"), jwk("ec", "e"), jwk("ed", "d")])],
        |_| {},
    );
    let mut auth = Auth::new(Arc::new(v));
    for (name, alg, kid) in [
        ("rsa", Algorithm::RS256, "r"),
        ("ec", Algorithm::ES256, "e"),
        ("ed", Algorithm::EdDSA, "d"),
    ] {
        let t = token(name, alg, Some(kid));
        let access = check(&mut auth, &t, SUB, "s", NOW).unwrap();
        assert_eq!(access.subject.as_deref(), Some("alice"), "{alg:?}");
    }
    // A known kid of another key: that key's signature check fails (no other key is tried).
    let t = token("ec", Algorithm::ES256, Some("d"));
    assert_eq!(
        check(&mut auth, &t, SUB, "s", NOW),
        Err(Denied::Invalid(Invalid::BadSignature))
    );
    // Without a kid every JWKS key of the alg is tried.
    let t = token("ec", Algorithm::ES256, None);
    assert!(check(&mut auth, &t, SUB, "s", NOW).is_ok());
}

#[test]
fn an_unknown_kid_is_refused_reported_and_known_after_a_refresh() {
    let v = verifier(vec![set(&[jwk("ec", "old")])], |_| {});
    let (keys, seen) = keys_with_hook(v);
    let mut auth = Auth::following(keys.clone());
    let new = token("ec_b", Algorithm::ES256, Some("new"));
    for _ in 0..3 {
        assert_eq!(
            check(&mut auth, &new, SUB, "s", NOW),
            Err(Denied::Invalid(Invalid::UnknownKid))
        );
    }
    assert_eq!(seen.load(Ordering::Relaxed), 3, "each refusal is reported");
    assert_eq!(keys.unknown_kids(), 3);

    // The refresh: the provider rotated ("old" dropped, "new" added).
    let installed = keys
        .update(|cur| Ok::<_, ()>(Some(cur.with_jwks(vec![set(&[jwk("ec_b", "new")])]))))
        .unwrap();
    assert!(installed);
    assert!(check(&mut auth, &new, SUB, "s", NOW).is_ok());
    let old = token("ec", Algorithm::ES256, Some("old"));
    assert_eq!(
        check(&mut auth, &old, SUB, "s", NOW),
        Err(Denied::Invalid(Invalid::UnknownKid)),
        "a dropped key's new token is refused"
    );
    // A known kid's forgery is a bad signature and is not reported.
    let forged = token("ec", Algorithm::ES256, Some("new"));
    assert_eq!(
        check(&mut auth, &forged, SUB, "s", NOW),
        Err(Denied::Invalid(Invalid::BadSignature))
    );
    assert_eq!(seen.load(Ordering::Relaxed), 4);
}

#[test]
fn an_update_that_changes_nothing_keeps_the_generation() {
    let (keys, _) = keys_with_hook(verifier(vec![set(&[jwk("ec", "e")])], |_| {}));
    let g = keys.generation();
    assert_eq!(keys.update(|_| Ok::<_, ()>(None)), Ok(false));
    assert_eq!(
        keys.update(|_| Err::<Option<Verifier>, _>("bad")),
        Err("bad")
    );
    assert_eq!(keys.generation(), g);
}

#[test]
fn key_files_and_jwks_together() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_file(dir.path(), "a.secret", SECRET_A);
    let v = verifier(vec![set(&[jwk("ec", "e")])], |s| {
        s.hs256_secret_files = vec![secret];
        s.public_key_files = vec![public("ed")];
    });
    let (keys, seen) = keys_with_hook(v);
    let mut auth = Auth::following(keys);
    let hs = sign_hs(SECRET_A, &claims("h", EXP, &[], &["s"]));
    assert!(check(&mut auth, &hs, SUB, "s", NOW).is_ok());
    // Key files' keys are tried whatever the kid: no refresh is asked for.
    let ed = token("ed", Algorithm::EdDSA, Some("not-in-any-jwks"));
    assert!(check(&mut auth, &ed, SUB, "s", NOW).is_ok());
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("whatever".into());
    let claims = claims("h", EXP, &[], &["s"]);
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET_A).unwrap();
    let hs_kid = encode(&header, &claims, &key).unwrap();
    assert!(check(&mut auth, &hs_kid, SUB, "s", NOW).is_ok());
    assert_eq!(seen.load(Ordering::Relaxed), 0);
}

#[test]
fn before_the_first_fetch_tokens_are_verified_and_refused() {
    let mut s = AuthSettings {
        jwks_urls: vec!["https://idp.example/jwks".into()],
        anonymous_subscribe: vec!["open".into()],
        ..AuthSettings::default()
    };
    s.cache_entries_max = 16;
    let v = Verifier::load(&s).unwrap();
    assert!(v.keys_configured() && v.enabled());
    assert!(v.jwks()[0].is_empty());
    let mut auth = Auth::new(Arc::new(v));
    let t = token("ec", Algorithm::ES256, Some("e"));
    assert_eq!(
        check(&mut auth, &t, SUB, "s", NOW),
        Err(Denied::Invalid(Invalid::UnknownKid))
    );
    assert_eq!(
        auth.check(&NONE, SUB, "open", NOW).map(|a| a.subject),
        Ok(None)
    );
    assert_eq!(auth.check(&NONE, SUB, "s", NOW), Err(Denied::Missing));
    // A JWKS brings no HS256 key: an HS256 token is refused before any crypto.
    let hs = sign_hs(SECRET_A, &claims("h", EXP, &[], &["s"]));
    assert_eq!(
        check(&mut auth, &hs, SUB, "s", NOW),
        Err(Denied::Invalid(Invalid::AlgNotAccepted))
    );
}
