//! The JWS algorithms the crate accepts, one per kind of key: what the key files load
//! (`keyfile`), what a token's header names (`token`), what the verifier checks with.

use jsonwebtoken::Algorithm;

/// The JWS algorithms this crate accepts: one per kind of key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyAlg {
    /// HMAC-SHA256 with a shared secret.
    Hs256,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// Ed25519.
    EdDsa,
}

impl KeyAlg {
    /// The JWS `alg` name.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyAlg::Hs256 => "HS256",
            KeyAlg::Rs256 => "RS256",
            KeyAlg::Es256 => "ES256",
            KeyAlg::EdDsa => "EdDSA",
        }
    }

    /// The algorithm a header's `alg` names, if it is one of ours (exact, case-sensitive: RFC
    /// 7515 §4.1.1).
    pub fn from_alg(alg: &str) -> Option<KeyAlg> {
        [KeyAlg::Hs256, KeyAlg::Rs256, KeyAlg::Es256, KeyAlg::EdDsa]
            .into_iter()
            .find(|k| k.as_str() == alg)
    }

    pub(crate) fn jwt(self) -> Algorithm {
        match self {
            KeyAlg::Hs256 => Algorithm::HS256,
            KeyAlg::Rs256 => Algorithm::RS256,
            KeyAlg::Es256 => Algorithm::ES256,
            KeyAlg::EdDsa => Algorithm::EdDSA,
        }
    }

    /// The kind of key, for messages.
    pub(crate) fn key_kind(self) -> &'static str {
        match self {
            KeyAlg::Hs256 => "HS256 secret",
            KeyAlg::Rs256 => "RSA",
            KeyAlg::Es256 => "EC P-256",
            KeyAlg::EdDsa => "Ed25519",
        }
    }
}
