//! JWT authentication and per-stream grants for the gateway. Pure: no sockets, no clock (every
//! call takes `now_unix_secs`), no I/O after [`Verifier::load`] has read the key files.
//!
//! # Layout
//!
//! - `lib.rs`: [`Auth`], one per reactor core: [`Auth::check`] (may this request do this to this
//!   stream?) and [`Auth::authenticate`] (who is this?), over an `Arc<Verifier>` and the core's
//!   own token cache.
//! - `verifier.rs`: [`AuthSettings`] (one field per flag) and [`Verifier`] (keys, claim rules,
//!   anonymous grants; immutable, `Send + Sync`), [`LoadError`].
//! - `keyfile.rs`: key files to keys: HS256 secrets; PEM public keys classified by their
//!   SubjectPublicKeyInfo (RSA → RS256, EC P-256 → ES256, Ed25519 → EdDSA).
//! - `jwks.rs`: JWKS documents (the bytes; the gateway fetches them) to keys by `kid`, and the
//!   reason each unusable key is skipped.
//! - `reload.rs`: [`Keys`], the verifier of the moment (SIGHUP and JWKS refreshes replace
//!   it; each core takes the new one up at its next check).
//! - `source.rs`: finding the request's one token (header, cookie, query) and its shape.
//! - `token.rs`: verifying a token: `alg` → candidate keys → signature → claims.
//! - `cache.rs`: the per-core bounded cache of verified tokens.
//! - `pattern.rs`: [`pattern_matches`] (`*` globs, linear time) and the grants.
//! - `denied.rs`: [`Denied`] and [`Invalid`]: status, JSON code, message, `WWW-Authenticate`.
//!
//! # Security decisions
//!
//! - **Sources**: `Authorization: Bearer <token>` (scheme in any case, exactly one token), then
//!   the cookie `--jwt-cookie-name` if set, then `?access_token=` only with
//!   `--jwt-allow-query-token` (query strings end up in logs). Another `Authorization` scheme
//!   counts as no token. Different tokens in two sources are refused (`conflicting tokens`)
//!   rather than one picked: a cookie planted by a sibling site must not silently win or lose.
//!   A token is at most [`TOKEN_BYTES_MAX`] bytes of base64url and `.`, checked before decoding.
//! - **A presented token is always verified**: a bad token is 401 even on a stream anonymous
//!   access would allow, so a client with a broken token learns it. A valid token gets its own
//!   grants plus the anonymous ones (authenticating never loses access). With no key configured
//!   tokens cannot be verified and are not looked at: anonymous patterns alone decide.
//! - **Algorithms**: exactly those of the configured keys are accepted (HS256 for secrets,
//!   RS256 / ES256 / EdDSA by the PEM's key type; all three with a JWKS URL); the token's `alg`
//!   selects the candidate keys, and each key file's key is tried in flag order (rotation;
//!   `kid` is not consulted for them); JWKS keys are tried only under the token's `kid` (all of
//!   them when it names none), and a `kid` no JWKS set knows is refused as unknown and asks the
//!   gateway for a refresh ([`Keys::note_unknown_kid`]). A JWKS never brings HS256: `oct` keys
//!   are skipped. `none` is refused by name; an HS256 token with only public keys configured is
//!   refused before any crypto (the HS/RS confusion: an HMAC "signed" with the public key's PEM
//!   bytes), and a secret file that holds a PEM block is refused at load. RSA moduli under 2048
//!   bits and secrets under 32 bytes are refused at load (and such JWKS keys are skipped).
//! - **Claims**: the signature is checked before any claim, so a forged token is always "bad
//!   signature". `exp` is required, with no leeway (expired when now >= exp); `nbf` is honoured;
//!   `iss` and `aud` are required and must match when configured (`aud` a string or an array).
//!   Grants: `{"gateway": {"publish": [..], "subscribe": [..], "mcp": true}}`, at most [`PATTERNS_MAX`]
//!   patterns of [`PATTERN_BYTES_MAX`] bytes per list; `mcp` (a boolean, default false) grants
//!   the MCP endpoint, which no anonymous pattern opens.
//! - **Cache**: each [`Auth`] maps the exact token text to its verified claims, so a token's
//!   signature (the cost of RS256 / ES256) is checked once per core. Only valid tokens are
//!   cached; an entry is never used at or after its `exp`; at most `--jwt-cache-entries-max`
//!   entries (expired ones swept first, then oldest first, O(1) amortised).
//! - **RFC 6750 §3 challenges**: `Bearer realm="gateway"` with no error code when no token was
//!   presented; `error="invalid_token"` for a bad or expired token (401);
//!   `error="insufficient_scope"` for a valid token without the grant (403). Messages name the
//!   broken rule and never echo the token or its claims.
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::Arc;

mod alg;
mod cache;
mod denied;
pub mod jwks;
mod keyfile;
mod pattern;
mod reload;
mod source;
mod token;
mod verifier;

pub use alg::KeyAlg;
pub use denied::{Denied, Invalid};
pub use keyfile::{KEYS_MAX, RSA_MODULUS_BITS_MIN, SECRET_BYTES_MIN};
pub use pattern::{PATTERN_BYTES_MAX, PATTERNS_MAX, pattern_matches};
pub use reload::Keys;
pub use source::TOKEN_BYTES_MAX;
pub use verifier::{AuthSettings, CACHE_ENTRIES_MAX_DEFAULT, KeySpec, LoadError, Verifier};

use cache::TokenCache;
use token::Verified;

/// What a request wants to do to a stream.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Action {
    Publish,
    Subscribe,
}

/// The parts of a request a token may come from.
#[derive(Clone, Copy)]
pub struct Credentials<'a> {
    /// The `Authorization` header's value.
    pub authorization: Option<&'a str>,
    /// The `Cookie` header's value.
    pub cookie: Option<&'a str>,
    /// The raw query string (after `?`; empty when none).
    pub query: &'a str,
}

/// Who was let in: the token's `iss`, `sub` and `exp` (all `None` for anonymous access), and
/// whether it grants the MCP endpoint (`{"gateway": {"mcp": true}}`; never anonymously).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Access {
    pub issuer: Option<String>,
    pub subject: Option<String>,
    pub expires_unix_secs: Option<u64>,
    pub mcp: bool,
}

impl Access {
    /// Access without a token.
    pub fn anonymous() -> Access {
        Access::default()
    }
}

/// One core's authenticator: the shared [`Verifier`] and this core's token cache.
pub struct Auth {
    verifier: Arc<Verifier>,
    /// Where a reloaded verifier comes from, and the generation this core has.
    keys: Option<(Arc<Keys>, u64)>,
    cache: TokenCache,
    /// Tokens verified (not found in the cache), valid or not.
    verifications: u64,
}

impl Auth {
    pub fn new(v: Arc<Verifier>) -> Auth {
        let cache = TokenCache::new(v.cache_entries_max);
        Auth {
            verifier: v,
            keys: None,
            cache,
            verifications: 0,
        }
    }

    /// An authenticator that takes up every verifier `keys` is given later (SIGHUP), its
    /// cache emptied then: a token of a key that was dropped is refused from then on.
    pub fn following(keys: Arc<Keys>) -> Auth {
        let (generation, v) = keys.current();
        let mut a = Auth::new(v);
        a.keys = Some((keys, generation));
        a
    }

    /// Takes up a newer verifier, if `keys` has one (one atomic load when not).
    fn refresh(&mut self) {
        let Some((keys, seen)) = &mut self.keys else {
            return;
        };
        if keys.generation() != *seen {
            let (generation, v) = keys.current();
            *seen = generation;
            self.cache = TokenCache::new(v.cache_entries_max);
            self.verifier = v;
        }
    }

    /// Whether access control is on (see [`Verifier::enabled`]).
    pub fn enabled(&self) -> bool {
        self.verifier.enabled()
    }

    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    /// Verified tokens in this core's cache.
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// Tokens this core has verified (those not answered from the cache), valid or not: a
    /// cache hit does not count. For metrics, and for tests that a cached token is not verified
    /// again.
    pub fn verifications(&self) -> u64 {
        self.verifications
    }

    /// Access to `stream` for `action`. If a token is presented it is verified (an invalid
    /// token is 401 even where anonymous access would allow). No token: the anonymous patterns
    /// decide, else [`Denied::Missing`]. With access control off, everyone is let in.
    pub fn check(
        &mut self,
        c: &Credentials<'_>,
        action: Action,
        stream: &str,
        now_unix_secs: u64,
    ) -> Result<Access, Denied> {
        self.refresh();
        let anonymous_allows = self.verifier.anonymous.allows(action, stream);
        if !self.verifier.enabled() {
            return Ok(Access::anonymous());
        }
        match self.presented_token(c)? {
            None if anonymous_allows => Ok(Access::anonymous()),
            None => Err(Denied::Missing),
            Some(token) => self.with_verified(token, now_unix_secs, |v| {
                if v.allows(action, stream) || anonymous_allows {
                    Ok(v.access())
                } else {
                    Err(Denied::Forbidden)
                }
            })?,
        }
    }

    /// A valid token regardless of stream grants (the MCP endpoint binds a session to `sub`).
    /// With no keys configured: anonymous, whatever the request carries.
    pub fn authenticate(
        &mut self,
        c: &Credentials<'_>,
        now_unix_secs: u64,
    ) -> Result<Access, Denied> {
        self.refresh();
        if !self.verifier.keys_configured() {
            return Ok(Access::anonymous());
        }
        let token = self.presented_token(c)?.ok_or(Denied::Missing)?;
        self.with_verified(token, now_unix_secs, Verified::access)
    }

    /// Access to the MCP endpoint. With no access control at all, everyone (the gateway is
    /// on loopback or explicitly open). Otherwise only a verified token that names a `sub`
    /// (sessions are bound to it) and grants `{"gateway": {"mcp": true}}`: anonymous patterns
    /// never open it, so with patterns and no key it is closed.
    pub fn authorize_mcp(
        &mut self,
        c: &Credentials<'_>,
        now_unix_secs: u64,
    ) -> Result<Access, Denied> {
        if !self.verifier.enabled() {
            return Ok(Access::anonymous());
        }
        if !self.verifier.keys_configured() {
            return Err(Denied::McpWithoutKeys);
        }
        let access = self.authenticate(c, now_unix_secs)?;
        if access.subject.is_none() {
            return Err(Denied::Invalid(Invalid::MissingSub));
        }
        if !access.mcp {
            return Err(Denied::McpNotGranted);
        }
        Ok(access)
    }

    /// The request's token, if any; never looked for when no key could verify it.
    fn presented_token<'a>(&self, c: &Credentials<'a>) -> Result<Option<&'a str>, Denied> {
        if !self.verifier.keys_configured() {
            return Ok(None);
        }
        let v = &self.verifier;
        source::presented_token(c, v.cookie_name.as_deref(), v.query_token).map_err(Denied::Invalid)
    }

    /// `f` of the token's verified claims: from the cache when there (refused at or after
    /// `exp`), else verified now and cached if valid.
    fn with_verified<R>(
        &mut self,
        token: &str,
        now_unix_secs: u64,
        f: impl FnOnce(&Verified) -> R,
    ) -> Result<R, Denied> {
        if let Some(v) = self.cache.get(token) {
            v.check_time(now_unix_secs)?;
            return Ok(f(v));
        }
        source::check_shape(token).map_err(Denied::Invalid)?;
        self.verifications += 1;
        let v = token::verify(&self.verifier, token, now_unix_secs).inspect_err(|d| {
            if let (Denied::Invalid(Invalid::UnknownKid), Some((keys, _))) = (d, &self.keys) {
                keys.note_unknown_kid();
            }
        })?;
        let r = f(&v);
        self.cache.insert(token, v, now_unix_secs);
        Ok(r)
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("verifier", &self.verifier)
            .field("cache", &self.cache)
            .field("verifications", &self.verifications)
            .finish()
    }
}

impl fmt::Debug for Credentials<'_> {
    /// Which parts are present, never their values (they carry bearer tokens).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("authorization", &self.authorization.map(|_| ".."))
            .field("cookie", &self.cookie.map(|_| ".."))
            .field("query_bytes", &self.query.len())
            .finish()
    }
}
