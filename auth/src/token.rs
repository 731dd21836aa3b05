//! Verifying one token: the header's `alg` picks the candidate keys, jsonwebtoken checks the
//! signature and `iss` / `aud`, and this module checks the time claims against the caller's
//! `now` and compiles the grants. Caches nothing (see `cache.rs`).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use serde::Deserialize;

use crate::alg::KeyAlg;
use crate::denied::{Denied, Invalid};
use crate::pattern::{Grants, PatternError, check_patterns};
use crate::verifier::Verifier;
use crate::{Access, Action};

/// What a valid token says: who, until when, and what it grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verified {
    pub(crate) issuer: Option<String>,
    pub(crate) subject: Option<String>,
    /// `{"gateway": {"mcp": true}}`: the MCP endpoint is granted.
    pub(crate) mcp: bool,
    pub(crate) exp_unix_secs: u64,
    pub(crate) nbf_unix_secs: Option<u64>,
    pub(crate) grants: Grants,
}

impl Verified {
    /// Whether the token may be used at `now`: before `exp` (no leeway: expired when
    /// now >= exp) and not before `nbf`.
    pub(crate) fn check_time(&self, now_unix_secs: u64) -> Result<(), Denied> {
        check_time(self.exp_unix_secs, self.nbf_unix_secs, now_unix_secs)
    }

    pub(crate) fn allows(&self, action: Action, stream: &str) -> bool {
        self.grants.allows(action, stream)
    }

    pub(crate) fn access(&self) -> Access {
        Access {
            issuer: self.issuer.clone(),
            subject: self.subject.clone(),
            expires_unix_secs: Some(self.exp_unix_secs),
            mcp: self.mcp,
        }
    }
}

/// The claims this crate reads (jsonwebtoken has checked `exp`'s presence, `iss` and `aud`).
#[derive(Deserialize)]
struct Claims {
    exp: Option<serde_json::Value>,
    nbf: Option<serde_json::Value>,
    iss: Option<String>,
    sub: Option<String>,
    gateway: Option<GatewayClaim>,
}

/// `{"gateway": {"publish": [patterns], "subscribe": [patterns], "mcp": true}}`; a missing
/// list grants nothing, a missing `mcp` is false.
#[derive(Deserialize)]
struct GatewayClaim {
    publish: Option<Vec<String>>,
    subscribe: Option<Vec<String>>,
    mcp: Option<bool>,
}

/// The part of the header read before any verification.
#[derive(Deserialize)]
struct PeekHeader {
    alg: String,
    kid: Option<String>,
}

/// Verifies `token` (already shape-checked: see `source.rs`) and reads its claims.
///
/// The signature is checked before any claim is looked at, so a forged token is
/// [`Invalid::BadSignature`] whatever it claims (never "expired" or "wrong audience").
pub(crate) fn verify(v: &Verifier, token: &str, now_unix_secs: u64) -> Result<Verified, Denied> {
    let (alg, kid) = peek_header(token).map_err(Denied::Invalid)?;
    let claims = decode(v, alg, kid.as_deref(), token).map_err(Denied::Invalid)?;
    let claims: Claims =
        serde_json::from_value(claims).map_err(|_| Denied::Invalid(Invalid::BadClaims))?;
    let exp = match claims.exp {
        None => return Err(Denied::Invalid(Invalid::MissingExp)),
        Some(exp) => numeric_date(&exp)?,
    };
    let nbf = claims.nbf.as_ref().map(numeric_date).transpose()?;
    let (publish, subscribe, mcp) = match claims.gateway {
        Some(g) => (
            g.publish.unwrap_or_default(),
            g.subscribe.unwrap_or_default(),
            g.mcp.unwrap_or(false),
        ),
        None => (Vec::new(), Vec::new(), false),
    };
    check_time(exp, nbf, now_unix_secs)?;
    if v.lifetime_max_secs
        .is_some_and(|max| exp - now_unix_secs > max)
    {
        return Err(Denied::Invalid(Invalid::LifetimeTooLong));
    }
    for list in [&publish, &subscribe] {
        check_patterns(list).map_err(|e| {
            Denied::Invalid(match e {
                PatternError::TooMany { .. } => Invalid::TooManyPatterns,
                PatternError::TooLong { .. } => Invalid::PatternTooLong,
            })
        })?;
    }
    Ok(Verified {
        issuer: claims.iss,
        subject: claims.sub,
        mcp,
        exp_unix_secs: exp,
        nbf_unix_secs: nbf,
        grants: Grants::new(publish, subscribe),
    })
}

/// No leeway: expired when now >= exp; not valid yet when now < nbf.
fn check_time(exp: u64, nbf: Option<u64>, now_unix_secs: u64) -> Result<(), Denied> {
    if now_unix_secs >= exp {
        return Err(Denied::Expired);
    }
    if nbf.is_some_and(|nbf| now_unix_secs < nbf) {
        return Err(Denied::Invalid(Invalid::NotYetValid));
    }
    Ok(())
}

/// The header's `alg`, if it is one this crate knows, and its `kid`. `none` in any case is
/// named as such. The token must be exactly `header.payload.signature` (jsonwebtoken splits
/// from the right; this peek and it must agree on which part is the header).
fn peek_header(token: &str) -> Result<(KeyAlg, Option<String>), Invalid> {
    let mut parts = token.split('.');
    let header = parts.next().unwrap_or_default();
    if parts.count() != 2 {
        return Err(Invalid::Malformed);
    }
    let json = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| Invalid::Malformed)?;
    let h: PeekHeader = serde_json::from_slice(&json).map_err(|_| Invalid::Malformed)?;
    if h.alg.eq_ignore_ascii_case("none") {
        return Err(Invalid::AlgNone);
    }
    let alg = KeyAlg::from_alg(&h.alg).ok_or(Invalid::AlgNotAccepted)?;
    Ok((alg, h.kid))
}

/// The verified claims of `token`: tries each candidate key of `alg` in turn until one
/// verifies the signature (rotation). Any error but a bad signature is the same for every key,
/// so it ends the search. Key files' keys are tried whatever the `kid` (with the handful
/// allowed, [`crate::KEYS_MAX`], trying each is cheap, and a kid would need a naming scheme
/// for files); JWKS keys only under the token's `kid` (all of them for a token without one).
/// A `kid` no JWKS set knows is [`Invalid::UnknownKid`] (the sets may be out of date).
fn decode(
    v: &Verifier,
    alg: KeyAlg,
    kid: Option<&str>,
    token: &str,
) -> Result<serde_json::Value, Invalid> {
    let validation = v.validation(alg).ok_or(Invalid::AlgNotAccepted)?;
    for key in v.keys_for(alg, kid) {
        match jsonwebtoken::decode::<serde_json::Value>(token, key, validation) {
            Ok(data) => return Ok(data.claims),
            Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => continue,
            Err(e) => return Err(invalid_from(e.kind())),
        }
    }
    match v.kid_unknown(alg, kid) {
        true => Err(Invalid::UnknownKid),
        false => Err(Invalid::BadSignature),
    }
}

/// The rule a jsonwebtoken error says the token broke.
fn invalid_from(kind: &ErrorKind) -> Invalid {
    match kind {
        ErrorKind::InvalidSignature => Invalid::BadSignature,
        ErrorKind::MissingRequiredClaim(c) | ErrorKind::InvalidClaimFormat(c) => match c.as_str() {
            "exp" => Invalid::MissingExp,
            "iss" => Invalid::WrongIssuer,
            "aud" => Invalid::WrongAudience,
            _ => Invalid::BadClaims,
        },
        ErrorKind::InvalidIssuer => Invalid::WrongIssuer,
        ErrorKind::InvalidAudience => Invalid::WrongAudience,
        ErrorKind::InvalidAlgorithm
        | ErrorKind::InvalidAlgorithmName
        | ErrorKind::UnsupportedAlgorithm => Invalid::AlgNotAccepted,
        _ => Invalid::Malformed,
    }
}

/// A NumericDate (RFC 7519 §2): a non-negative number of seconds; a fraction is dropped.
fn numeric_date(v: &serde_json::Value) -> Result<u64, Denied> {
    let bad = Denied::Invalid(Invalid::BadTimeClaim);
    let n = v.as_number().ok_or(bad)?;
    if let Some(secs) = n.as_u64() {
        return Ok(secs);
    }
    match n.as_f64() {
        // `as` saturates at u64::MAX for huge values: a date beyond any clock.
        Some(f) if f.is_finite() && f >= 0.0 => Ok(f as u64),
        _ => Err(bad),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numeric_dates() {
        assert_eq!(numeric_date(&json!(10)), Ok(10));
        assert_eq!(numeric_date(&json!(10.9)), Ok(10));
        assert!(numeric_date(&json!(-1)).is_err());
        assert!(numeric_date(&json!("10")).is_err());
        assert!(numeric_date(&json!(null)).is_err());
    }

    fn peek_alg(token: &str) -> Result<KeyAlg, Invalid> {
        peek_header(token).map(|(alg, _)| alg)
    }

    #[test]
    fn peek_kid() {
        let enc = |h: &str| format!("{}.e30.", URL_SAFE_NO_PAD.encode(h));
        let got = peek_header(&enc(r#"{"alg":"ES256","kid":"k1"}"#));
        assert_eq!(got, Ok((KeyAlg::Es256, Some("k1".into()))));
        let number = peek_header(&enc(r#"{"alg":"ES256","kid":1}"#));
        assert_eq!(number, Err(Invalid::Malformed));
    }

    #[test]
    fn peek() {
        let enc = |h: &str| format!("{}.e30.", URL_SAFE_NO_PAD.encode(h));
        assert_eq!(peek_alg(&enc(r#"{"alg":"none"}"#)), Err(Invalid::AlgNone));
        assert_eq!(peek_alg(&enc(r#"{"alg":"NONE"}"#)), Err(Invalid::AlgNone));
        assert_eq!(
            peek_alg(&enc(r#"{"alg":"HS512"}"#)),
            Err(Invalid::AlgNotAccepted)
        );
        assert_eq!(
            peek_alg(&enc(r#"{"alg":"es256"}"#)),
            Err(Invalid::AlgNotAccepted)
        );
        assert_eq!(peek_alg(&enc(r#"{"typ":"JWT"}"#)), Err(Invalid::Malformed));
        assert_eq!(peek_alg(&enc(r#"{"alg":"ES256"}"#)), Ok(KeyAlg::Es256));
        assert_eq!(peek_alg("!!.e30."), Err(Invalid::Malformed));
        let four = format!("{}.x", enc(r#"{"alg":"ES256"}"#));
        assert_eq!(peek_alg(&four), Err(Invalid::Malformed));
        assert_eq!(
            peek_alg(&enc(r#"{"alg":"ES256"}"#)[..10]),
            Err(Invalid::Malformed)
        );
    }

    #[test]
    fn time_rules() {
        let v = Verified {
            issuer: None,
            subject: None,
            mcp: false,
            exp_unix_secs: 100,
            nbf_unix_secs: Some(50),
            grants: Grants::default(),
        };
        assert_eq!(v.check_time(49), Err(Denied::Invalid(Invalid::NotYetValid)));
        assert_eq!(v.check_time(50), Ok(()));
        assert_eq!(v.check_time(99), Ok(()));
        assert_eq!(v.check_time(100), Err(Denied::Expired));
    }
}
