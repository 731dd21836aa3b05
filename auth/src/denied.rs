//! Why a request was refused, and how to say so over HTTP: status, JSON error code, message and
//! the RFC 6750 `WWW-Authenticate` challenge. No message ever contains the token or its claims.

use std::fmt;

/// A refusal. Each variant maps to one status and one JSON error code ([`Denied::status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No token was presented and no anonymous pattern grants the action: 401.
    Missing,
    /// A token was presented and is not acceptable: 401, with the exact reason.
    Invalid(Invalid),
    /// A token with a good signature whose `exp` has passed (now >= exp): 401.
    Expired,
    /// A valid token that does not grant this action on this stream: 403.
    Forbidden,
    /// A valid token without `{"gateway": {"mcp": true}}` on the MCP endpoint: 403.
    McpNotGranted,
    /// The MCP endpoint with only anonymous patterns configured (no key): anonymous access
    /// never opens it, and no token can be verified: 403.
    McpWithoutKeys,
}

/// Why a presented token is not acceptable. The names say which rule the token broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// Over [`crate::TOKEN_BYTES_MAX`] bytes (refused before any decoding).
    TooLarge,
    /// A character outside base64url and `.`.
    BadCharacters,
    /// `Authorization: Bearer` without exactly one token after it.
    MalformedAuthorization,
    /// Two sources (header, cookie, query) carry different tokens.
    ConflictingTokens,
    /// Not three base64url parts with a JSON header and payload.
    Malformed,
    /// The header says `alg: none` (unsigned): never accepted.
    AlgNone,
    /// An `alg` no configured key is for (e.g. HS256 with only public keys configured).
    AlgNotAccepted,
    /// No configured key of the token's `alg` verifies its signature.
    BadSignature,
    /// The header's `kid` names no key of any JWKS set (`--jwt-jwks-url`), and no key file's
    /// key verifies the signature. The gateway refreshes the sets (at most once per
    /// `--jwt-jwks-refetch-min-secs`): a client may retry.
    UnknownKid,
    /// No `exp` claim (required).
    MissingExp,
    /// `exp` or `nbf` is not a NumericDate.
    BadTimeClaim,
    /// `nbf` is still in the future.
    NotYetValid,
    /// `iss` is missing or is not the configured issuer.
    WrongIssuer,
    /// `aud` is missing or does not name the configured audience.
    WrongAudience,
    /// `sub` or `iss` is not a string, or `gateway` is not `{"publish": [..], "subscribe":
    /// [..], "mcp": bool}` of strings.
    BadClaims,
    /// A grant list holds more than [`crate::PATTERNS_MAX`] patterns.
    TooManyPatterns,
    /// A grant pattern has more than [`crate::PATTERN_BYTES_MAX`] bytes.
    PatternTooLong,
    /// No `sub` claim, on the MCP endpoint (its sessions are bound to the subject).
    MissingSub,
    /// `exp` further away than `--jwt-lifetime-max-secs`.
    LifetimeTooLong,
}

/// `WWW-Authenticate` when the request had no credentials (RFC 6750 §3.1: no error code).
const CHALLENGE: &str = "Bearer realm=\"gateway\"";
/// `WWW-Authenticate` for a bad, malformed or expired token.
const CHALLENGE_INVALID: &str = "Bearer realm=\"gateway\", error=\"invalid_token\"";
/// `WWW-Authenticate` for a valid token without the grant.
const CHALLENGE_SCOPE: &str = "Bearer realm=\"gateway\", error=\"insufficient_scope\"";

impl Denied {
    /// The HTTP status, the JSON error code and a message for the client. The message names
    /// the rule that failed, never the token or what it claims.
    pub fn status(&self) -> (u16, &'static str, String) {
        match self {
            Denied::Missing => (
                401,
                "unauthorized",
                "a bearer token is required (none was presented)".into(),
            ),
            Denied::Invalid(why) => (401, "invalid_token", format!("invalid token: {why}")),
            Denied::Expired => (401, "token_expired", "the token has expired".into()),
            Denied::Forbidden => (
                403,
                "forbidden",
                "the token does not grant this action on this stream".into(),
            ),
            Denied::McpNotGranted => (
                403,
                "forbidden",
                "the token does not grant the MCP endpoint (it needs the claim \
                 {\"gateway\": {\"mcp\": true}})"
                    .into(),
            ),
            Denied::McpWithoutKeys => (
                403,
                "mcp_needs_keys",
                "the MCP endpoint needs a verified token, and this gateway has no JWT key \
                 configured (anonymous patterns never open it)"
                    .into(),
            ),
        }
    }

    /// The `WWW-Authenticate` value to send with the refusal (RFC 6750 §3); none where no
    /// token could help.
    pub fn www_authenticate(&self) -> Option<&'static str> {
        Some(match self {
            Denied::Missing => CHALLENGE,
            Denied::Invalid(_) | Denied::Expired => CHALLENGE_INVALID,
            Denied::Forbidden | Denied::McpNotGranted => CHALLENGE_SCOPE,
            Denied::McpWithoutKeys => return None,
        })
    }
}

impl Invalid {
    /// A short description of the broken rule.
    pub fn as_str(self) -> &'static str {
        match self {
            Invalid::TooLarge => "token too large",
            Invalid::BadCharacters => "token has characters outside base64url and '.'",
            Invalid::MalformedAuthorization => {
                "Authorization: Bearer must be followed by exactly one token"
            }
            Invalid::ConflictingTokens => "conflicting tokens",
            Invalid::Malformed => "malformed token",
            Invalid::AlgNone => "unsigned tokens (alg none) are not accepted",
            Invalid::AlgNotAccepted => "the token's alg is not accepted",
            Invalid::BadSignature => "bad signature",
            Invalid::UnknownKid => "the token's key id (kid) is not known",
            Invalid::MissingExp => "exp claim is required",
            Invalid::BadTimeClaim => "exp or nbf is not a NumericDate",
            Invalid::NotYetValid => "token not valid yet (nbf)",
            Invalid::WrongIssuer => "wrong or missing issuer",
            Invalid::WrongAudience => "wrong or missing audience",
            Invalid::BadClaims => "malformed claims (sub or gateway grants)",
            Invalid::TooManyPatterns => "too many grant patterns",
            Invalid::PatternTooLong => "grant pattern too long",
            Invalid::MissingSub => {
                "the MCP endpoint needs a sub claim (its sessions are bound to the subject)"
            }
            Invalid::LifetimeTooLong => "token exp is further away than --jwt-lifetime-max-secs",
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.status().2)
    }
}

impl std::error::Error for Denied {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_challenges() {
        assert_eq!(Denied::Missing.status().0, 401);
        assert_eq!(Denied::Expired.status().0, 401);
        assert_eq!(Denied::Invalid(Invalid::BadSignature).status().0, 401);
        assert_eq!(Denied::Forbidden.status().0, 403);
        assert_eq!(
            Denied::Missing.www_authenticate(),
            Some("Bearer realm=\"gateway\"")
        );
        assert_eq!(
            Denied::Expired.www_authenticate(),
            Some("Bearer realm=\"gateway\", error=\"invalid_token\"")
        );
        assert_eq!(
            Denied::Forbidden.www_authenticate(),
            Some("Bearer realm=\"gateway\", error=\"insufficient_scope\"")
        );
        let (_, code, msg) = Denied::Invalid(Invalid::ConflictingTokens).status();
        assert_eq!(code, "invalid_token");
        assert!(msg.contains("conflicting tokens"));
    }
}
