//! JWKS documents (RFC 7517) to verification keys: RSA (`n`, `e`) → RS256, EC P-256 (`x`, `y`)
//! → ES256, OKP Ed25519 (`x`) → EdDSA. Pure: the gateway fetches the bytes, this module only
//! reads them; it verifies no token.
//!
//! A key that cannot be used is skipped with a reason ([`Skipped`]), never silently: `oct`
//! keys (a JWKS never carries shared secrets: such a key would let whoever can read the
//! document mint tokens), keys carrying private parts, `use` other than `sig`, `key_ops`
//! without `verify`, an `alg` other than RS256 / ES256 / EdDSA or one that does not fit the
//! key type, other curves, RSA moduli under [`crate::RSA_MODULUS_BITS_MIN`] bits, and
//! components of the wrong size. The document as a whole is refused ([`JwksError`]) when it is
//! not a JSON object with a `keys` array, when none of its keys is usable (an identity provider
//! always publishes one: an empty set is a broken document, not a revocation of every key), or
//! when it has more than [`crate::KEYS_MAX`] usable keys.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::DecodingKey;
use serde::Deserialize;

use crate::alg::KeyAlg;
use crate::keyfile::{KEYS_MAX, RSA_MODULUS_BITS_MIN, probe};

/// Bytes a `kid` may have; a key with a longer one is skipped.
pub const KID_BYTES_MAX: usize = 256;

/// The usable keys of one JWKS document, in document order. Two sets are equal when they hold
/// the same keys (ids, algorithms and public components), so a refresh that changed nothing
/// can be told apart from a rotation.
#[derive(Clone, Default)]
pub struct JwkSet {
    pub(crate) keys: Vec<Jwk>,
}

/// One usable key.
#[derive(Clone)]
pub(crate) struct Jwk {
    pub(crate) kid: Option<String>,
    pub(crate) alg: KeyAlg,
    /// The public components as the document gave them (base64url), for equality.
    components: Vec<String>,
    pub(crate) decoding: DecodingKey,
}

/// A key of the document that was not taken, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Its place in the `keys` array (from 0).
    pub index: usize,
    /// Its `kid`, if it had a usable one.
    pub kid: Option<String>,
    pub why: String,
}

/// Why a whole document was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwksError {
    /// Not JSON, or not an object with a `keys` array of objects.
    Malformed(String),
    /// No key in the document is usable (each one's reason is in `skipped`).
    NoUsableKey { skipped: Vec<Skipped> },
    /// More usable keys than [`crate::KEYS_MAX`].
    TooManyKeys { count: usize },
}

/// The fields of a JWK this module reads (RFC 7517 §4, RFC 7518 §6, RFC 8037 §2); unknown
/// fields are ignored, as RFC 7517 §4 asks.
#[derive(Deserialize)]
struct RawJwk {
    kty: Option<String>,
    kid: Option<serde_json::Value>,
    #[serde(rename = "use")]
    use_: Option<String>,
    key_ops: Option<Vec<String>>,
    alg: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
    d: Option<serde_json::Value>,
    k: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

/// The usable keys of a JWKS document and the ones skipped.
pub fn parse(doc: &[u8]) -> Result<(JwkSet, Vec<Skipped>), JwksError> {
    let raw: RawSet = serde_json::from_slice(doc)
        .map_err(|e| JwksError::Malformed(format!("not a JWKS document ({e})")))?;
    let mut keys = Vec::new();
    let mut skipped = Vec::new();
    for (index, value) in raw.keys.into_iter().enumerate() {
        let kid = value.get("kid").and_then(|k| k.as_str()).map(str::to_owned);
        let kid = kid.filter(|k| k.len() <= KID_BYTES_MAX);
        let result = serde_json::from_value::<RawJwk>(value)
            .map_err(|e| format!("malformed key ({e})"))
            .and_then(one_key);
        match result {
            Ok(k) => keys.push(k),
            Err(why) => skipped.push(Skipped { index, kid, why }),
        }
    }
    if keys.is_empty() {
        return Err(JwksError::NoUsableKey { skipped });
    }
    if keys.len() > KEYS_MAX {
        return Err(JwksError::TooManyKeys { count: keys.len() });
    }
    Ok((JwkSet { keys }, skipped))
}

/// One JWK to a key, or why not.
fn one_key(raw: RawJwk) -> Result<Jwk, String> {
    let kid = check_purpose(&raw)?;
    let kty = raw.kty.as_deref().ok_or("no kty")?;
    let need = |v: &Option<String>, name: &str| {
        v.clone().ok_or_else(|| format!("{kty} key without {name}"))
    };
    let (alg, components, decoding) = match (kty, raw.crv.as_deref()) {
        ("RSA", _) => {
            let (n, e) = (need(&raw.n, "n")?, need(&raw.e, "e")?);
            let key = rsa_key(&n, &e)?;
            (KeyAlg::Rs256, vec![n, e], key)
        }
        ("EC", Some("P-256")) => {
            let (x, y) = (need(&raw.x, "x")?, need(&raw.y, "y")?);
            let (xb, yb) = (b64(&x, "x")?, b64(&y, "y")?);
            if xb.len() != 32 || yb.len() != 32 {
                return Err("P-256 x and y must have 32 bytes each".into());
            }
            let mut point = Vec::with_capacity(65);
            point.push(0x04);
            point.extend_from_slice(&xb);
            point.extend_from_slice(&yb);
            (KeyAlg::Es256, vec![x, y], DecodingKey::from_ec_der(&point))
        }
        ("OKP", Some("Ed25519")) => {
            let x = need(&raw.x, "x")?;
            if b64(&x, "x")?.len() != 32 {
                return Err("Ed25519 x must have 32 bytes".into());
            }
            let key = DecodingKey::from_ed_components(&x).map_err(|e| e.to_string())?;
            (KeyAlg::EdDsa, vec![x], key)
        }
        ("EC" | "OKP", crv) => {
            return Err(format!(
                "{kty} curve {crv:?} is not supported (EC P-256 or OKP Ed25519)"
            ));
        }
        (other, _) => return Err(format!("kty {other:?} is not supported (RSA, EC, OKP)")),
    };
    if let Some(a) = raw.alg.as_deref().filter(|a| *a != alg.as_str()) {
        return Err(format!(
            "alg {a:?} is not accepted for a {} key (only {})",
            alg.key_kind(),
            alg.as_str()
        ));
    }
    probe(alg, &decoding)?;
    Ok(Jwk {
        kid,
        alg,
        components,
        decoding,
    })
}

/// The key's `kid`, if this is a public signature-verification key; else why it is not one.
fn check_purpose(raw: &RawJwk) -> Result<Option<String>, String> {
    let kid = match &raw.kid {
        None => None,
        Some(serde_json::Value::String(k)) if k.len() <= KID_BYTES_MAX => Some(k.clone()),
        Some(serde_json::Value::String(_)) => {
            return Err(format!("kid longer than {KID_BYTES_MAX} bytes"));
        }
        Some(_) => return Err("kid is not a string".into()),
    };
    if raw.kty.as_deref() == Some("oct") || raw.k.is_some() {
        return Err(
            "a shared-secret (oct) key: a JWKS never carries secrets, and HS256 \
                    secrets come only from --jwt-hs256-secret-file"
                .into(),
        );
    }
    if raw.d.is_some() {
        return Err("carries private key material (d): the URL serves private keys".into());
    }
    if let Some(u) = raw.use_.as_deref().filter(|u| *u != "sig") {
        return Err(format!("use {u:?} is not \"sig\""));
    }
    if let Some(ops) = raw
        .key_ops
        .as_ref()
        .filter(|o| !o.iter().any(|op| op == "verify"))
    {
        return Err(format!("key_ops {ops:?} lack \"verify\""));
    }
    Ok(kid)
}

/// An RSA key from base64url `n` and `e`, with a modulus of at least
/// [`RSA_MODULUS_BITS_MIN`] bits.
fn rsa_key(n: &str, e: &str) -> Result<DecodingKey, String> {
    let nb = b64(n, "n")?;
    let eb = b64(e, "e")?;
    let nb = match nb.iter().position(|&b| b != 0) {
        Some(i) => &nb[i..],
        None => &[][..],
    };
    let bits = nb
        .first()
        .map_or(0, |&top| nb.len() * 8 - top.leading_zeros() as usize);
    if bits < RSA_MODULUS_BITS_MIN {
        return Err(format!(
            "RSA modulus has {bits} bits, at least {RSA_MODULUS_BITS_MIN} are required"
        ));
    }
    if eb.iter().all(|&b| b == 0) {
        return Err("RSA exponent is zero".into());
    }
    Ok(DecodingKey::from_rsa_raw_components(nb, &eb))
}

/// A base64url (no padding) component.
fn b64(v: &str, name: &str) -> Result<Vec<u8>, String> {
    URL_SAFE_NO_PAD
        .decode(v)
        .map_err(|_| format!("{name} is not base64url"))
}

impl JwkSet {
    /// Usable keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Each key's `kid` and algorithm, in document order (for logs: no key material).
    pub fn describe(&self) -> Vec<(Option<&str>, KeyAlg)> {
        self.keys
            .iter()
            .map(|k| (k.kid.as_deref(), k.alg))
            .collect()
    }

    /// Whether some key has this `kid`.
    pub(crate) fn knows_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

impl PartialEq for JwkSet {
    fn eq(&self, other: &JwkSet) -> bool {
        self.keys.len() == other.keys.len()
            && self
                .keys
                .iter()
                .zip(&other.keys)
                .all(|(a, b)| a.kid == b.kid && a.alg == b.alg && a.components == b.components)
    }
}

impl Eq for JwkSet {}

impl fmt::Debug for JwkSet {
    /// Ids and algorithms, never key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.describe()).finish()
    }
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kid {
            Some(kid) => write!(f, "key {} (kid {kid:?}): {}", self.index, self.why),
            None => write!(f, "key {}: {}", self.index, self.why),
        }
    }
}

impl fmt::Display for JwksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JwksError::Malformed(why) => f.write_str(why),
            JwksError::NoUsableKey { skipped } if skipped.is_empty() => {
                f.write_str("the document has no keys")
            }
            JwksError::NoUsableKey { skipped } => {
                f.write_str("no usable key in the document: ")?;
                for (i, s) in skipped.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "; " };
                    write!(f, "{sep}{s}")?;
                }
                Ok(())
            }
            JwksError::TooManyKeys { count } => {
                write!(f, "{count} usable keys in the document, at most {KEYS_MAX}")
            }
        }
    }
}

impl std::error::Error for JwksError {}

#[cfg(test)]
mod tests;
