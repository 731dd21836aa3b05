//! The settings (one field per flag), and the [`Verifier`] loaded from them once at start: the
//! keys, the claim rules and the anonymous grants, shared read-only by every core.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jsonwebtoken::{DecodingKey, Validation};

use crate::alg::KeyAlg;
use crate::jwks::JwkSet;
use crate::keyfile::{self, KEYS_MAX};
use crate::pattern::{Grants, check_patterns};

/// Default of `--jwt-cache-entries-max`.
pub const CACHE_ENTRIES_MAX_DEFAULT: usize = 10_000;

/// The authentication flags, as parsed by the gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthSettings {
    /// `--jwt-hs256-secret-file` (repeatable): each file's bytes are one HS256 secret.
    pub hs256_secret_files: Vec<PathBuf>,
    /// `--jwt-public-key-file` (repeatable): PEM public keys, RS256 / ES256 / EdDSA by kind.
    pub public_key_files: Vec<PathBuf>,
    /// `--jwt-issuer`: when set, `iss` must be present and equal.
    pub issuer: Option<String>,
    /// `--jwt-audience`: when set, `aud` (a string or an array) must be present and name it.
    pub audience: Option<String>,
    /// `--jwt-cookie-name`: a token may come from this cookie.
    pub cookie_name: Option<String>,
    /// `--jwt-allow-query-token`: a token may come from `?access_token=`.
    pub query_token: bool,
    /// `--anonymous-subscribe PATTERN` (repeatable): streams anyone may subscribe to.
    pub anonymous_subscribe: Vec<String>,
    /// `--anonymous-publish PATTERN` (repeatable): streams anyone may publish to.
    pub anonymous_publish: Vec<String>,
    /// `--jwt-cache-entries-max`: verified tokens each core keeps (0: no cache).
    pub cache_entries_max: usize,
    /// `--jwt-lifetime-max-secs`: a token whose `exp` is further away than this is refused
    /// (`None`: no bound).
    pub lifetime_max_secs: Option<u64>,
    /// `--jwt-jwks-url` (repeatable): JWKS documents the gateway fetches; the verifier holds
    /// one key set per URL, in flag order ([`Verifier::with_jwks`]), empty until the first
    /// good fetch. It reads no URL itself.
    pub jwks_urls: Vec<String>,
}

impl Default for AuthSettings {
    /// Access control off; the flags' defaults.
    fn default() -> AuthSettings {
        AuthSettings {
            hs256_secret_files: Vec::new(),
            public_key_files: Vec::new(),
            issuer: None,
            audience: None,
            cookie_name: None,
            query_token: false,
            anonymous_subscribe: Vec::new(),
            anonymous_publish: Vec::new(),
            cache_entries_max: CACHE_ENTRIES_MAX_DEFAULT,
            lifetime_max_secs: None,
            jwks_urls: Vec::new(),
        }
    }
}

/// One configured key: the file it came from and the algorithm it verifies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpec {
    /// The algorithm (from the flag for secrets, from the PEM for public keys).
    pub alg: KeyAlg,
    /// The file named by the flag.
    pub path: PathBuf,
}

/// A key ready to verify with.
#[derive(Clone)]
pub(crate) struct Key {
    pub(crate) spec: KeySpec,
    pub(crate) decoding: DecodingKey,
}

/// Everything needed to verify tokens and decide anonymous access. Immutable after
/// [`Verifier::load`]; shared by all cores through an `Arc`. A new key set (SIGHUP, a JWKS
/// refresh) is a new verifier ([`Verifier::with_jwks`], [`crate::Keys`]).
#[derive(Clone)]
pub struct Verifier {
    /// Secrets first, then public keys, each in flag order (the order tried).
    keys: Vec<Key>,
    /// One key set per `--jwt-jwks-url`, in flag order (empty until fetched).
    jwks: Vec<Arc<JwkSet>>,
    /// The claim rules for each algorithm that has a key.
    validations: Vec<(KeyAlg, Validation)>,
    pub(crate) anonymous: Grants,
    pub(crate) cookie_name: Option<String>,
    pub(crate) query_token: bool,
    pub(crate) cache_entries_max: usize,
    pub(crate) lifetime_max_secs: Option<u64>,
}

/// Why [`Verifier::load`] failed: always names the flag, and the file where there is one.
#[derive(Debug)]
pub enum LoadError {
    /// A key file could not be read.
    Read {
        flag: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// A key file was read but is not a usable key (`why` says what is wrong with it).
    Key {
        flag: &'static str,
        path: PathBuf,
        why: String,
    },
    /// More than [`KEYS_MAX`] keys.
    TooManyKeys { count: usize },
    /// A setting without a file is not acceptable.
    Setting { flag: &'static str, why: String },
}

const FLAG_SECRET: &str = "--jwt-hs256-secret-file";
const FLAG_PUBLIC: &str = "--jwt-public-key-file";

impl Verifier {
    /// Reads the key files and checks the settings.
    pub fn load(s: &AuthSettings) -> Result<Verifier, LoadError> {
        let keys = load_keys(s)?;
        check_settings(s)?;
        // A JWKS may bring a key of any public-key algorithm at its next refresh.
        let jwks_algs = match s.jwks_urls.is_empty() {
            true => &[][..],
            false => &[KeyAlg::Rs256, KeyAlg::Es256, KeyAlg::EdDsa][..],
        };
        let mut validations: Vec<(KeyAlg, Validation)> = Vec::new();
        for alg in keys
            .iter()
            .map(|k| k.spec.alg)
            .chain(jwks_algs.iter().copied())
        {
            if !validations.iter().any(|(a, _)| *a == alg) {
                let v = validation(alg, s.issuer.as_deref(), s.audience.as_deref());
                validations.push((alg, v));
            }
        }
        Ok(Verifier {
            keys,
            jwks: s.jwks_urls.iter().map(|_| Arc::default()).collect(),
            validations,
            anonymous: Grants::new(s.anonymous_publish.clone(), s.anonymous_subscribe.clone()),
            cookie_name: s.cookie_name.clone(),
            query_token: s.query_token,
            cache_entries_max: s.cache_entries_max,
            lifetime_max_secs: s.lifetime_max_secs,
        })
    }

    /// Whether any JWT key source is configured: a key file, or a JWKS URL (even before its
    /// first good fetch: tokens are then verified, and refused, rather than ignored).
    pub fn keys_configured(&self) -> bool {
        !self.keys.is_empty() || !self.jwks.is_empty()
    }

    /// This verifier with `sets` as its JWKS keys, one per `--jwt-jwks-url` in flag order.
    ///
    /// Panics if `sets` has another length than the URLs the verifier was loaded with.
    pub fn with_jwks(&self, sets: Vec<Arc<JwkSet>>) -> Verifier {
        assert_eq!(sets.len(), self.jwks.len(), "one key set per JWKS URL");
        Verifier {
            jwks: sets,
            ..self.clone()
        }
    }

    /// The JWKS key sets, one per `--jwt-jwks-url` in flag order.
    pub fn jwks(&self) -> &[Arc<JwkSet>] {
        &self.jwks
    }

    /// Whether access control is on: a key or an anonymous pattern is configured.
    pub fn enabled(&self) -> bool {
        self.keys_configured() || !self.anonymous.is_empty()
    }

    /// The configured keys, in the order they are tried.
    pub fn key_specs(&self) -> impl Iterator<Item = &KeySpec> {
        self.keys.iter().map(|k| &k.spec)
    }

    /// The algorithms a token may use: exactly those of the configured keys.
    pub fn accepted_algs(&self) -> impl Iterator<Item = KeyAlg> + '_ {
        self.validations.iter().map(|(a, _)| *a)
    }

    /// The keys a token of `alg` with header `kid` is tried against, in order: the key files'
    /// keys of `alg` (they have no id), then the JWKS keys of `alg` whose `kid` is the token's
    /// (all of them when the token names none).
    pub(crate) fn keys_for<'a>(
        &'a self,
        alg: KeyAlg,
        kid: Option<&'a str>,
    ) -> impl Iterator<Item = &'a DecodingKey> {
        let files = self.keys.iter().filter(move |k| k.spec.alg == alg);
        let jwks = self.jwks.iter().flat_map(|s| s.keys.iter());
        let jwks = jwks.filter(move |k| k.alg == alg && (kid.is_none() || k.kid.as_deref() == kid));
        files.map(|k| &k.decoding).chain(jwks.map(|k| &k.decoding))
    }

    /// Whether a token's `kid` names no key of any JWKS set, for an algorithm a JWKS may
    /// serve: the sets may be out of date (the gateway then refreshes them, rate-limited).
    pub(crate) fn kid_unknown(&self, alg: KeyAlg, kid: Option<&str>) -> bool {
        match kid {
            Some(kid) if alg != KeyAlg::Hs256 && !self.jwks.is_empty() => {
                !self.jwks.iter().any(|s| s.knows_kid(kid))
            }
            _ => false,
        }
    }

    /// The claim rules for `alg`; `None` when no key of `alg` is configured.
    pub(crate) fn validation(&self, alg: KeyAlg) -> Option<&Validation> {
        self.validations
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, v)| v)
    }
}

impl fmt::Debug for Verifier {
    /// Key files and algorithms, never key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &self.key_specs().collect::<Vec<_>>())
            .field("jwks", &self.jwks)
            .field("anonymous", &self.anonymous)
            .field("cookie_name", &self.cookie_name)
            .field("query_token", &self.query_token)
            .field("cache_entries_max", &self.cache_entries_max)
            .finish()
    }
}

/// The keys of the two key-file flags: secrets first, then public keys, in flag order.
fn load_keys(s: &AuthSettings) -> Result<Vec<Key>, LoadError> {
    let count = s.hs256_secret_files.len() + s.public_key_files.len();
    if count > KEYS_MAX {
        return Err(LoadError::TooManyKeys { count });
    }
    let mut keys = Vec::with_capacity(count);
    for path in &s.hs256_secret_files {
        let bytes = read(FLAG_SECRET, path)?;
        let decoding =
            keyfile::hs256_secret(&bytes).map_err(|why| key_error(FLAG_SECRET, path, why))?;
        let spec = KeySpec {
            alg: KeyAlg::Hs256,
            path: path.clone(),
        };
        keys.push(Key { spec, decoding });
    }
    for path in &s.public_key_files {
        let bytes = read(FLAG_PUBLIC, path)?;
        let (alg, decoding) =
            keyfile::public_key(&bytes).map_err(|why| key_error(FLAG_PUBLIC, path, why))?;
        keys.push(Key {
            spec: KeySpec {
                alg,
                path: path.clone(),
            },
            decoding,
        });
    }
    Ok(keys)
}

/// The claim rules for tokens of `alg`. Time claims are not checked here (the library would
/// read the system clock): [`crate::token`] checks `exp` and `nbf` against the caller's `now`
/// with no leeway. `exp` is required; `iss` and `aud` are required and must match when set, and
/// not looked at otherwise.
fn validation(alg: KeyAlg, issuer: Option<&str>, audience: Option<&str>) -> Validation {
    let mut v = Validation::new(alg.jwt());
    v.leeway = 0;
    v.validate_exp = false;
    v.validate_nbf = false;
    let mut required = vec!["exp"];
    if let Some(iss) = issuer {
        v.set_issuer(&[iss]);
        required.push("iss");
    }
    v.validate_aud = audience.is_some();
    if let Some(aud) = audience {
        v.set_audience(&[aud]);
        required.push("aud");
    }
    v.set_required_spec_claims(&required);
    v
}

/// The settings that name no file: non-empty issuer, audience and cookie name, a cookie name
/// that is an RFC 6265 token, anonymous patterns within the limits.
fn check_settings(s: &AuthSettings) -> Result<(), LoadError> {
    let setting = |flag, why: &str| {
        Err(LoadError::Setting {
            flag,
            why: why.into(),
        })
    };
    if s.issuer.as_deref() == Some("") {
        return setting("--jwt-issuer", "must not be empty");
    }
    if s.audience.as_deref() == Some("") {
        return setting("--jwt-audience", "must not be empty");
    }
    if let Some(name) = &s.cookie_name {
        let token_char = |c: char| c.is_ascii_graphic() && !"()<>@,;:\\\"/[]?={}".contains(c);
        if name.is_empty() || !name.chars().all(token_char) {
            return setting(
                "--jwt-cookie-name",
                "must be a cookie name (RFC 6265 token)",
            );
        }
    }
    for (flag, list) in [
        ("--anonymous-subscribe", &s.anonymous_subscribe),
        ("--anonymous-publish", &s.anonymous_publish),
    ] {
        if let Err(e) = check_patterns(list) {
            return Err(LoadError::Setting {
                flag,
                why: e.to_string(),
            });
        }
    }
    Ok(())
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|error| LoadError::Read {
        flag,
        path: path.into(),
        error,
    })
}

fn key_error(flag: &'static str, path: &Path, why: String) -> LoadError {
    LoadError::Key {
        flag,
        path: path.into(),
        why,
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Read { flag, path, error } => {
                write!(f, "{flag} {}: cannot read: {error}", path.display())
            }
            LoadError::Key { flag, path, why } => write!(f, "{flag} {}: {why}", path.display()),
            LoadError::TooManyKeys { count } => {
                write!(f, "{count} JWT keys configured, at most {KEYS_MAX}")
            }
            LoadError::Setting { flag, why } => write!(f, "{flag}: {why}"),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Read { error, .. } => Some(error),
            _ => None,
        }
    }
}
