//! Grants, anonymous access, token sources and `authenticate`.

mod common;

use auth::{Access, Action, Credentials, Denied, Invalid};
use common::*;

const PUB: Action = Action::Publish;
const SUB: Action = Action::Subscribe;

#[test]
fn grants_by_action_and_pattern() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let token = sign_hs(
        SECRET_A,
        &claims("a", EXP, &["orders.*", "log"], &["*.eu", "news"]),
    );
    assert!(check(&mut auth, &token, PUB, "orders.1", NOW).is_ok());
    assert!(check(&mut auth, &token, PUB, "log", NOW).is_ok());
    assert_eq!(
        check(&mut auth, &token, PUB, "logs", NOW),
        Err(Denied::Forbidden)
    );
    assert_eq!(
        check(&mut auth, &token, PUB, "news", NOW),
        Err(Denied::Forbidden)
    );
    assert!(check(&mut auth, &token, SUB, "orders.eu", NOW).is_ok());
    assert!(check(&mut auth, &token, SUB, "news", NOW).is_ok());
    assert_eq!(
        check(&mut auth, &token, SUB, "orders.1", NOW),
        Err(Denied::Forbidden)
    );
}

#[test]
fn no_grants_claim_grants_nothing() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let token = sign_hs(SECRET_A, &serde_json::json!({ "sub": "a", "exp": EXP }));
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        Err(Denied::Forbidden)
    );
    let only_pub = sign_hs(
        SECRET_A,
        &serde_json::json!({ "exp": EXP, "gateway": { "publish": ["s"] } }),
    );
    assert_eq!(
        check(&mut auth, &only_pub, SUB, "s", NOW),
        Err(Denied::Forbidden)
    );
    assert!(check(&mut auth, &only_pub, PUB, "s", NOW).is_ok());
    assert_eq!(Denied::Forbidden.status().0, 403);
}

#[test]
fn anonymous_patterns_without_a_token() {
    let (mut auth, _dir) = hs_auth(|s| {
        s.anonymous_subscribe = vec!["public.*".into()];
        s.anonymous_publish = vec!["inbox".into()];
    });
    assert_eq!(
        auth.check(&NONE, SUB, "public.x", NOW),
        Ok(Access::anonymous())
    );
    assert_eq!(
        auth.check(&NONE, PUB, "inbox", NOW),
        Ok(Access::anonymous())
    );
    assert_eq!(
        auth.check(&NONE, PUB, "public.x", NOW),
        Err(Denied::Missing)
    );
    assert_eq!(auth.check(&NONE, SUB, "private", NOW), Err(Denied::Missing));
    assert_eq!(Denied::Missing.status().0, 401);
}

#[test]
fn anonymous_patterns_with_a_token() {
    let (mut auth, _dir) = hs_auth(|s| s.anonymous_subscribe = vec!["public.*".into()]);
    // A bad token is refused even where anonymous access would allow.
    let bad = sign_hs(SECRET_B, &claims("a", EXP, &[], &[]));
    assert_eq!(
        check(&mut auth, &bad, SUB, "public.x", NOW),
        Err(Denied::Invalid(Invalid::BadSignature))
    );
    let expired = sign_hs(SECRET_A, &claims("a", NOW, &[], &[]));
    assert_eq!(
        check(&mut auth, &expired, SUB, "public.x", NOW),
        Err(Denied::Expired)
    );
    // A valid token keeps the anonymous grants, with its subject.
    let good = sign_hs(SECRET_A, &claims("a", EXP, &[], &["private"]));
    let access = check(&mut auth, &good, SUB, "public.x", NOW).unwrap();
    assert_eq!(access.subject.as_deref(), Some("a"));
    assert!(check(&mut auth, &good, SUB, "private", NOW).is_ok());
    assert_eq!(
        check(&mut auth, &good, SUB, "other", NOW),
        Err(Denied::Forbidden)
    );
}

#[test]
fn anonymous_only_ignores_tokens() {
    let mut auth = auth_with(|s| s.anonymous_subscribe = vec!["*".into()]);
    assert!(auth.enabled());
    assert!(!auth.verifier().keys_configured());
    let any = header("Bearer not-even-a-jwt");
    assert_eq!(auth.check(&any, SUB, "s", NOW), Ok(Access::anonymous()));
    assert_eq!(auth.check(&any, PUB, "s", NOW), Err(Denied::Missing));
    assert_eq!(auth.authenticate(&any, NOW), Ok(Access::anonymous()));
}

#[test]
fn disabled_lets_everyone_in() {
    let mut auth = auth_with(|_| {});
    assert!(!auth.enabled());
    assert_eq!(auth.check(&NONE, PUB, "s", NOW), Ok(Access::anonymous()));
    assert_eq!(auth.authenticate(&NONE, NOW), Ok(Access::anonymous()));
}

#[test]
fn cookie_source_only_when_configured() {
    let token = sign_hs(SECRET_A, &claims("a", EXP, &[], &["s"]));
    let cookie = format!("theme=dark; jwt={token}; x=y");
    let c = Credentials {
        authorization: None,
        cookie: Some(&cookie),
        query: "",
    };
    let (mut with, _d1) = hs_auth(|s| s.cookie_name = Some("jwt".into()));
    assert_eq!(
        with.check(&c, SUB, "s", NOW).unwrap().subject.as_deref(),
        Some("a")
    );
    let (mut without, _d2) = hs_auth(|_| {});
    assert_eq!(without.check(&c, SUB, "s", NOW), Err(Denied::Missing));
}

#[test]
fn query_source_only_with_the_flag() {
    let token = sign_hs(SECRET_A, &claims("a", EXP, &[], &["s"]));
    let query = format!("from=latest&access_token={token}");
    let c = Credentials {
        authorization: None,
        cookie: None,
        query: &query,
    };
    let (mut with, _d1) = hs_auth(|s| s.query_token = true);
    assert!(with.check(&c, SUB, "s", NOW).is_ok());
    let (mut without, _d2) = hs_auth(|_| {});
    assert_eq!(without.check(&c, SUB, "s", NOW), Err(Denied::Missing));
    let bad = "access_token=abc%2Edef";
    let c = Credentials {
        authorization: None,
        cookie: None,
        query: bad,
    };
    assert_eq!(
        with.check(&c, SUB, "s", NOW),
        Err(Denied::Invalid(Invalid::BadCharacters))
    );
}

#[test]
fn conflicting_tokens() {
    let (mut auth, _dir) = hs_auth(|s| {
        s.cookie_name = Some("jwt".into());
        s.query_token = true;
    });
    let t1 = sign_hs(SECRET_A, &claims("a", EXP, &[], &["s"]));
    let t2 = sign_hs(SECRET_A, &claims("b", EXP, &[], &["s"]));
    let h = bearer(&t1);
    let cookie = format!("jwt={t2}");
    let c = Credentials {
        authorization: Some(&h),
        cookie: Some(&cookie),
        query: "",
    };
    let d = auth.check(&c, SUB, "s", NOW).unwrap_err();
    assert_eq!(d, Denied::Invalid(Invalid::ConflictingTokens));
    assert!(d.status().2.contains("conflicting tokens"));
    assert_no_leak(&d, &t1);
    assert_no_leak(&d, &t2);
    let query = format!("access_token={t2}");
    let c = Credentials {
        authorization: Some(&h),
        cookie: None,
        query: &query,
    };
    assert_eq!(
        auth.check(&c, SUB, "s", NOW),
        Err(Denied::Invalid(Invalid::ConflictingTokens))
    );
    // The same token in several places is one token.
    let cookie = format!("jwt={t1}");
    let query = format!("access_token={t1}");
    let c = Credentials {
        authorization: Some(&h),
        cookie: Some(&cookie),
        query: &query,
    };
    assert!(auth.check(&c, SUB, "s", NOW).is_ok());
}

#[test]
fn authorization_schemes() {
    let (mut auth, _dir) = hs_auth(|s| s.anonymous_subscribe = vec!["pub".into()]);
    let token = sign_hs(SECRET_A, &claims("a", EXP, &[], &["s"]));
    let lower = format!("bearer {token}");
    assert!(auth.check(&header(&lower), SUB, "s", NOW).is_ok());
    // Another scheme is no token: anonymous rules apply.
    assert!(
        auth.check(&header("Basic dXNlcjpwYXNz"), SUB, "pub", NOW)
            .is_ok()
    );
    assert_eq!(
        auth.check(&header("Basic dXNlcjpwYXNz"), SUB, "s", NOW),
        Err(Denied::Missing)
    );
    let two = format!("Bearer {token} {token}");
    assert_eq!(
        auth.check(&header(&two), SUB, "s", NOW),
        Err(Denied::Invalid(Invalid::MalformedAuthorization))
    );
    assert_eq!(
        auth.check(&header("Bearer"), SUB, "pub", NOW),
        Err(Denied::Invalid(Invalid::MalformedAuthorization))
    );
}

#[test]
fn authenticate_ignores_grants() {
    let (mut auth, _dir) = hs_auth(|s| s.anonymous_subscribe = vec!["*".into()]);
    let token = sign_hs(SECRET_A, &serde_json::json!({ "sub": "carol", "exp": EXP }));
    let h = bearer(&token);
    let access = auth.authenticate(&header(&h), NOW).unwrap();
    assert_eq!(
        access,
        Access {
            issuer: None,
            subject: Some("carol".into()),
            expires_unix_secs: Some(EXP),
            mcp: false,
        }
    );
    assert_eq!(auth.authenticate(&NONE, NOW), Err(Denied::Missing));
    assert_eq!(auth.authenticate(&header(&h), EXP), Err(Denied::Expired));
    let bad = bearer(&sign_hs(SECRET_B, &serde_json::json!({ "exp": EXP })));
    assert_eq!(
        auth.authenticate(&header(&bad), NOW),
        Err(Denied::Invalid(Invalid::BadSignature))
    );
}

/// The MCP endpoint: a verified token with a `sub` and `{"gateway": {"mcp": true}}`; never
/// anonymous patterns (with patterns and no key it is closed); open only with no access
/// control at all.
#[test]
fn the_mcp_endpoint_needs_a_subject_and_its_grant() {
    let (mut auth, _dir) = hs_auth(|s| s.anonymous_subscribe = vec!["*".into()]);
    let granted =
        serde_json::json!({ "sub": "dana", "iss": "idp", "exp": EXP, "gateway": { "mcp": true } });
    let h = bearer(&sign_hs(SECRET_A, &granted));
    let access = auth.authorize_mcp(&header(&h), NOW).unwrap();
    assert_eq!(
        (
            access.issuer.as_deref(),
            access.subject.as_deref(),
            access.mcp
        ),
        (Some("idp"), Some("dana"), true)
    );
    let streams_only = claims("dana", EXP, &["*"], &["*"]);
    let h = bearer(&sign_hs(SECRET_A, &streams_only));
    assert_eq!(
        auth.authorize_mcp(&header(&h), NOW),
        Err(Denied::McpNotGranted)
    );
    let no_sub = serde_json::json!({ "exp": EXP, "gateway": { "mcp": true } });
    let h = bearer(&sign_hs(SECRET_A, &no_sub));
    let d = auth.authorize_mcp(&header(&h), NOW).unwrap_err();
    assert_eq!(d, Denied::Invalid(Invalid::MissingSub));
    assert_eq!(d.status().0, 401);
    assert_eq!(auth.authorize_mcp(&NONE, NOW), Err(Denied::Missing));
    let mut anonymous_only = auth_with(|s| s.anonymous_subscribe = vec!["*".into()]);
    assert_eq!(
        anonymous_only.authorize_mcp(&NONE, NOW),
        Err(Denied::McpWithoutKeys)
    );
    assert_eq!(Denied::McpWithoutKeys.www_authenticate(), None);
    let mut open = auth_with(|_| {});
    assert_eq!(open.authorize_mcp(&NONE, NOW), Ok(Access::anonymous()));
}
