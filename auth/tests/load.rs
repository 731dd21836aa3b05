//! `Verifier::load`: each kind of key file, and each refusal naming its file.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use auth::{AuthSettings, KEYS_MAX, KeyAlg, LoadError, Verifier};
use common::*;

fn load(edit: impl FnOnce(&mut AuthSettings)) -> Result<Verifier, LoadError> {
    let mut s = AuthSettings::default();
    edit(&mut s);
    Verifier::load(&s)
}

fn load_err(edit: impl FnOnce(&mut AuthSettings)) -> String {
    load(edit).unwrap_err().to_string()
}

#[test]
fn detects_each_public_key_kind() {
    let v = load(|s| {
        s.public_key_files = vec![
            public("rsa"),
            public("ec"),
            public("ed"),
            keys_dir().join("rsa.pkcs1.pub"),
        ];
    })
    .unwrap();
    let algs: Vec<KeyAlg> = v.key_specs().map(|k| k.alg).collect();
    assert_eq!(
        algs,
        [KeyAlg::Rs256, KeyAlg::Es256, KeyAlg::EdDsa, KeyAlg::Rs256]
    );
    let accepted: Vec<KeyAlg> = v.accepted_algs().collect();
    assert_eq!(accepted, [KeyAlg::Rs256, KeyAlg::Es256, KeyAlg::EdDsa]);
    assert!(v.keys_configured() && v.enabled());
}

#[test]
fn defaults_are_off() {
    let v = load(|_| {}).unwrap();
    assert!(!v.keys_configured());
    assert!(!v.enabled());
    assert_eq!(AuthSettings::default().cache_entries_max, 10_000);
    let anon = load(|s| s.anonymous_publish = vec!["x".into()]).unwrap();
    assert!(!anon.keys_configured() && anon.enabled());
}

#[test]
fn missing_file_names_it() {
    let e = load_err(|s| s.public_key_files = vec![PathBuf::from("/nonexistent/key.pem")]);
    assert!(
        e.contains("--jwt-public-key-file /nonexistent/key.pem: cannot read"),
        "{e}"
    );
    let e = load_err(|s| s.hs256_secret_files = vec![PathBuf::from("/nonexistent/s")]);
    assert!(e.contains("--jwt-hs256-secret-file /nonexistent/s"), "{e}");
}

#[test]
fn short_secret_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = secret_file(dir.path(), "short", &[b'k'; 31]);
    let e = load_err(|s| s.hs256_secret_files = vec![path.clone()]);
    assert!(
        e.contains(&path.display().to_string()) && e.contains("31 bytes"),
        "{e}"
    );
    let ok = secret_file(dir.path(), "ok", &[b'k'; 32]);
    assert!(load(|s| s.hs256_secret_files = vec![ok]).is_ok());
}

#[test]
fn public_key_as_secret_is_refused() {
    let e = load_err(|s| s.hs256_secret_files = vec![public("rsa")]);
    assert!(e.contains("PEM"), "{e}");
}

#[test]
fn wrong_kinds_of_pem_are_refused_by_name() {
    let cases = [
        (keys_dir().join("rsa.key"), "private key"),
        (keys_dir().join("ec.key"), "private key"),
        (public("p384"), "P-256"),
        (public("rsa1024"), "1024 bits"),
    ];
    for (path, why) in cases {
        let e = load_err(|s| s.public_key_files = vec![path.clone()]);
        assert!(
            e.contains(&path.display().to_string()) && e.contains(why),
            "{e}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let junk = secret_file(dir.path(), "junk.pem", b"not a pem at all");
    let e = load_err(|s| s.public_key_files = vec![junk.clone()]);
    assert!(e.contains("junk.pem") && e.contains("not a PEM"), "{e}");
}

#[test]
fn settings_are_checked() {
    assert!(load_err(|s| s.issuer = Some(String::new())).contains("--jwt-issuer"));
    assert!(load_err(|s| s.audience = Some(String::new())).contains("--jwt-audience"));
    assert!(load_err(|s| s.cookie_name = Some("a b".into())).contains("--jwt-cookie-name"));
    let many = vec!["x".to_string(); auth::PATTERNS_MAX + 1];
    assert!(load_err(|s| s.anonymous_subscribe = many).contains("--anonymous-subscribe"));
    let paths = vec![public("ec"); KEYS_MAX + 1];
    assert!(load_err(|s| s.public_key_files = paths).contains("at most"));
}

#[test]
fn verifier_is_shareable() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Verifier>();
    fn send<T: Send>() {}
    send::<auth::Auth>();
    let v = Arc::new(load(|s| s.public_key_files = vec![public("ec")]).unwrap());
    let debug = format!("{:?}", auth::Auth::new(v));
    assert!(
        debug.contains("ec.pub") && debug.contains("Es256"),
        "{debug}"
    );
}
