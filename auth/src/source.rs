//! Where a request's token comes from: `Authorization: Bearer`, then the configured cookie, then
//! `?access_token=` when allowed. Only finds and shape-checks the token; verifies nothing.

use crate::Credentials;
use crate::denied::Invalid;

/// Bytes a token may have; a longer one is refused before any decoding.
pub const TOKEN_BYTES_MAX: usize = 8 * 1024;

/// The query parameter that may carry a token (RFC 6750 §2.3).
const QUERY_PARAM: &str = "access_token";

/// The one token the request presents, if any. Sources in order: `Authorization: Bearer`, the
/// cookie `cookie_name` (when configured), `access_token=` in the query (when `query_token`).
/// The same token in several sources is fine; two different ones are
/// [`Invalid::ConflictingTokens`]. Any other `Authorization` scheme counts as no token.
pub(crate) fn presented_token<'a>(
    c: &Credentials<'a>,
    cookie_name: Option<&str>,
    query_token: bool,
) -> Result<Option<&'a str>, Invalid> {
    let mut found = None;
    if let Some(value) = c.authorization
        && let Some(t) = bearer(value)?
    {
        take(&mut found, t)?;
    }
    if let (Some(name), Some(header)) = (cookie_name, c.cookie) {
        for t in cookie_values(header, name) {
            take(&mut found, t)?;
        }
    }
    if query_token {
        for t in query_values(c.query, QUERY_PARAM) {
            take(&mut found, t)?;
        }
    }
    Ok(found)
}

/// Records `token` as the request's token: equal to any found before. Its shape is checked
/// before it is verified ([`check_shape`]), not here: a token found in the cache passed it.
fn take<'a>(found: &mut Option<&'a str>, token: &'a str) -> Result<(), Invalid> {
    if token.len() > TOKEN_BYTES_MAX {
        return Err(Invalid::TooLarge);
    }
    match found {
        Some(f) if *f != token => Err(Invalid::ConflictingTokens),
        _ => {
            *found = Some(token);
            Ok(())
        }
    }
}

/// A token's size and alphabet: at most [`TOKEN_BYTES_MAX`] bytes, base64url and `.` only
/// (what a compact JWS is made of), and not empty.
pub(crate) fn check_shape(token: &str) -> Result<(), Invalid> {
    if token.len() > TOKEN_BYTES_MAX {
        return Err(Invalid::TooLarge);
    }
    if token.is_empty() {
        return Err(Invalid::Malformed);
    }
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    if !token.bytes().all(ok) {
        return Err(Invalid::BadCharacters);
    }
    Ok(())
}

/// The token of an `Authorization` value with the `Bearer` scheme (any case), `None` for any
/// other scheme. Bearer must be followed by one space and exactly one token.
fn bearer(value: &str) -> Result<Option<&str>, Invalid> {
    let value = value.trim_matches([' ', '\t']);
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Ok(None);
    }
    if rest.is_empty() || rest.contains([' ', '\t']) {
        return Err(Invalid::MalformedAuthorization);
    }
    Ok(Some(rest))
}

/// The values of every cookie called `name` in a `Cookie` header value (`a=b; c="d"`), with
/// the optional double quotes of RFC 6265 §4.1.1 removed.
fn cookie_values<'a>(header: &'a str, name: &str) -> impl Iterator<Item = &'a str> {
    header.split(';').filter_map(move |pair| {
        let (k, v) = pair.split_once('=')?;
        if k.trim_matches([' ', '\t']) != name {
            return None;
        }
        let v = v.trim_matches([' ', '\t']);
        Some(
            v.strip_prefix('"')
                .and_then(|x| x.strip_suffix('"'))
                .unwrap_or(v),
        )
    })
}

/// The values of every `key=` parameter of a raw query string (without the `?`). No
/// percent-decoding: a JWT needs none, and [`check_shape`] refuses `%`.
fn query_values<'a>(query: &'a str, key: &str) -> impl Iterator<Item = &'a str> {
    let query = query.strip_prefix('?').unwrap_or(query);
    query.split('&').filter_map(move |pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds<'a>(a: Option<&'a str>, c: Option<&'a str>, q: &'a str) -> Credentials<'a> {
        Credentials {
            authorization: a,
            cookie: c,
            query: q,
        }
    }

    #[test]
    fn bearer_forms() {
        assert_eq!(bearer("Bearer a.b.c"), Ok(Some("a.b.c")));
        assert_eq!(bearer("bEARER a.b.c "), Ok(Some("a.b.c")));
        assert_eq!(bearer("Basic dXNlcjpwdw=="), Ok(None));
        assert_eq!(bearer("Bearer"), Err(Invalid::MalformedAuthorization));
        assert_eq!(bearer("Bearer a b"), Err(Invalid::MalformedAuthorization));
        assert_eq!(bearer("Bearer  a"), Err(Invalid::MalformedAuthorization));
    }

    #[test]
    fn sources_in_order_and_flags() {
        let c = creds(None, Some("x=1; jwt=\"a.b.c\""), "access_token=a.b.c");
        assert_eq!(presented_token(&c, Some("jwt"), false), Ok(Some("a.b.c")));
        assert_eq!(presented_token(&c, None, true), Ok(Some("a.b.c")));
        assert_eq!(presented_token(&c, None, false), Ok(None));
        assert_eq!(presented_token(&c, Some("other"), false), Ok(None));
        let c = creds(Some("Bearer a.b.c"), Some("jwt=a.b.d"), "");
        assert_eq!(
            presented_token(&c, Some("jwt"), true),
            Err(Invalid::ConflictingTokens)
        );
        assert_eq!(presented_token(&c, None, true), Ok(Some("a.b.c")));
        let c = creds(None, None, "x=1&access_token=a.b.c&access_token=a.b.d");
        assert_eq!(
            presented_token(&c, None, true),
            Err(Invalid::ConflictingTokens)
        );
    }

    #[test]
    fn shapes() {
        // Found as presented; the shape is checked before verification (not on a cache hit).
        let c = creds(None, None, "access_token=a%2Eb");
        assert_eq!(presented_token(&c, None, true), Ok(Some("a%2Eb")));
        assert_eq!(check_shape("a%2Eb"), Err(Invalid::BadCharacters));
        assert_eq!(check_shape(""), Err(Invalid::Malformed));
        assert_eq!(check_shape("a.b_c-D"), Ok(()));
        let big = format!("Bearer {}", "a".repeat(TOKEN_BYTES_MAX + 1));
        let c = creds(Some(&big), None, "");
        assert_eq!(presented_token(&c, None, false), Err(Invalid::TooLarge));
        let exact = format!("Bearer {}", "a".repeat(TOKEN_BYTES_MAX));
        let c = creds(Some(&exact), None, "");
        assert!(presented_token(&c, None, false).is_ok());
    }
}
