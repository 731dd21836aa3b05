//! Test helpers shared by the integration tests and the bench: keys made with the `openssl`
//! CLI at test time (once, into the target's tmp dir; no key file is committed), token signing
//! and a verifier built from a few settings.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use auth::{Access, Action, Auth, AuthSettings, Credentials, Denied, Verifier};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

/// The tests' wall clock.
pub const NOW: u64 = 1_700_000_000;
/// An `exp` an hour after [`NOW`].
pub const EXP: u64 = NOW + 3600;

/// Bump when the set of generated keys changes.
const KEYS_DIR: &str = "auth-test-keys-v1";

/// The directory of generated keys: `NAME.key` (PKCS#8 private) and `NAME.pub` (SPKI public)
/// for rsa, rsa_b (a second RSA key), ec, ec_b, ed, p384, rsa1024; `rsa.pkcs1.pub` (RSA PUBLIC
/// KEY). Made once per target dir; concurrent test processes race benignly (each builds in its
/// own temporary dir, the first rename wins).
pub fn keys_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let done = root.join(KEYS_DIR);
        if done.join("complete").exists() {
            return done;
        }
        let tmp = root.join(format!("{KEYS_DIR}.tmp.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        generate(&tmp);
        std::fs::write(tmp.join("complete"), b"").unwrap();
        if std::fs::rename(&tmp, &done).is_err() {
            // Another process got there first (or a stale incomplete dir is in the way).
            if !done.join("complete").exists() {
                std::fs::remove_dir_all(&done).unwrap();
                std::fs::rename(&tmp, &done).unwrap();
            } else {
                let _ = std::fs::remove_dir_all(&tmp);
            }
        }
        done
    })
}

fn generate(dir: &Path) {
    let gen_args: &[(&str, &[&str])] = &[
        (
            "rsa",
            &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        ),
        (
            "rsa_b",
            &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        ),
        (
            "rsa1024",
            &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"],
        ),
        (
            "ec",
            &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        ),
        (
            "ec_b",
            &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        ),
        (
            "p384",
            &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
        ),
        ("ed", &["-algorithm", "ed25519"]),
    ];
    for (name, args) in gen_args {
        let key = dir.join(format!("{name}.key"));
        let public = dir.join(format!("{name}.pub"));
        openssl(&[&["genpkey"], *args, &["-out", path_str(&key)]].concat());
        openssl(&[
            "pkey",
            "-in",
            path_str(&key),
            "-pubout",
            "-out",
            path_str(&public),
        ]);
    }
    let rsa = dir.join("rsa.key");
    let pkcs1 = dir.join("rsa.pkcs1.pub");
    openssl(&[
        "rsa",
        "-in",
        path_str(&rsa),
        "-RSAPublicKey_out",
        "-out",
        path_str(&pkcs1),
    ]);
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("the openssl CLI runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

/// The public key file of generated key `name`.
pub fn public(name: &str) -> PathBuf {
    keys_dir().join(format!("{name}.pub"))
}

/// The signing key of generated key `name` (`alg` says how to read it).
pub fn signing_key(name: &str, alg: Algorithm) -> EncodingKey {
    let pem = std::fs::read(keys_dir().join(format!("{name}.key"))).unwrap();
    match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem),
        other => panic!("no generated key for {other:?}"),
    }
    .unwrap()
}

/// A 32-byte-plus HS256 secret written to a file in `dir`, with a trailing newline.
pub fn secret_file(dir: &Path, name: &str, secret: &[u8]) -> PathBuf {
    let path = dir.join(name);
    let mut bytes = secret.to_vec();
    bytes.push(b'\n');
    std::fs::write(&path, bytes).unwrap();
    path
}

pub const SECRET_A: &[u8] = b"secret-a-0123456789abcdef0123456789abcdef";
pub const SECRET_B: &[u8] = b"secret-b-0123456789abcdef0123456789abcdef";

/// Signs `claims` with `alg` and `key`.
pub fn sign(alg: Algorithm, key: &EncodingKey, claims: &Value) -> String {
    encode(&Header::new(alg), claims, key).unwrap()
}

/// Signs `claims` with HS256 and `secret`.
pub fn sign_hs(secret: &[u8], claims: &Value) -> String {
    sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(secret).unwrap(),
        claims,
    )
}

/// Claims with `sub`, `exp` and the two grant lists.
pub fn claims(sub: &str, exp: u64, publish: &[&str], subscribe: &[&str]) -> Value {
    json!({ "sub": sub, "exp": exp, "gateway": { "publish": publish, "subscribe": subscribe } })
}

/// An `Auth` over settings that `edit` adjusts from the defaults.
pub fn auth_with(edit: impl FnOnce(&mut AuthSettings)) -> Auth {
    let mut s = AuthSettings::default();
    edit(&mut s);
    Auth::new(Arc::new(Verifier::load(&s).unwrap()))
}

/// An `Auth` with one HS256 secret ([`SECRET_A`]); keeps the temp dir alive with it.
pub fn hs_auth(edit: impl FnOnce(&mut AuthSettings)) -> (Auth, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = secret_file(dir.path(), "a.secret", SECRET_A);
    let auth = auth_with(|s| {
        s.hs256_secret_files = vec![path];
        edit(s);
    });
    (auth, dir)
}

/// `Authorization: Bearer <token>`.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Credentials with only an `Authorization` value.
pub fn header(value: &str) -> Credentials<'_> {
    Credentials {
        authorization: Some(value),
        cookie: None,
        query: "",
    }
}

/// Credentials with nothing.
pub const NONE: Credentials<'static> = Credentials {
    authorization: None,
    cookie: None,
    query: "",
};

/// `check` with a bearer token.
pub fn check(
    auth: &mut Auth,
    token: &str,
    action: Action,
    stream: &str,
    now: u64,
) -> Result<Access, Denied> {
    let value = bearer(token);
    let result = auth.check(&header(&value), action, stream, now);
    if let Err(d) = &result {
        assert_no_leak(d, token);
    }
    result
}

/// The refusal's message mentions neither the token nor any of its three parts.
pub fn assert_no_leak(d: &Denied, token: &str) {
    let (_, code, message) = d.status();
    for part in std::iter::once(token).chain(token.split('.')) {
        if part.len() >= 8 {
            assert!(
                !message.contains(part),
                "{code}: message {message:?} leaks the token"
            );
        }
    }
}
