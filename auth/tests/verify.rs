//! Token verification end to end through `Auth::check`: each algorithm, and each way a token
//! can be wrong (forged, unsigned, confused, expired, wrong issuer or audience, oversized).

mod common;

use auth::{Action, Denied, Invalid, TOKEN_BYTES_MAX};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::json;

const SUB: Action = Action::Subscribe;

fn invalid(why: Invalid) -> Result<auth::Access, Denied> {
    Err(Denied::Invalid(why))
}

#[test]
fn each_algorithm_verifies() {
    for (name, alg) in [
        ("rsa", Algorithm::RS256),
        ("ec", Algorithm::ES256),
        ("ed", Algorithm::EdDSA),
    ] {
        let mut auth = auth_with(|s| s.public_key_files = vec![public(name)]);
        let token = sign(
            alg,
            &signing_key(name, alg),
            &claims("alice", EXP, &[], &["s"]),
        );
        let access = check(&mut auth, &token, SUB, "s", NOW).unwrap();
        assert_eq!(access.subject.as_deref(), Some("alice"), "{alg:?}");
        assert_eq!(access.expires_unix_secs, Some(EXP));
    }
    let (mut auth, _dir) = hs_auth(|_| {});
    let token = sign_hs(SECRET_A, &claims("bob", EXP, &[], &["s"]));
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW)
            .unwrap()
            .subject
            .as_deref(),
        Some("bob")
    );
}

#[test]
fn pkcs1_rsa_public_key_verifies() {
    let mut auth = auth_with(|s| s.public_key_files = vec![keys_dir().join("rsa.pkcs1.pub")]);
    let token = sign(
        Algorithm::RS256,
        &signing_key("rsa", Algorithm::RS256),
        &claims("a", EXP, &[], &["s"]),
    );
    assert!(check(&mut auth, &token, SUB, "s", NOW).is_ok());
}

#[test]
fn alg_none_is_refused() {
    let (mut auth, _dir) = hs_auth(|s| s.anonymous_subscribe = vec!["*".into()]);
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims("mallory", EXP, &["*"], &["*"]).to_string());
    let token = format!("{header}.{payload}.");
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        invalid(Invalid::AlgNone)
    );
    assert_eq!(auth.cache_len(), 0);
}

#[test]
fn hs_rs_confusion_is_refused() {
    // An HS256 token whose HMAC key is the RSA public key's PEM text.
    let pem = std::fs::read(public("rsa")).unwrap();
    let forged = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(&pem).unwrap(),
        &claims("m", EXP, &[], &["*"]),
    );
    let mut rsa_only = auth_with(|s| s.public_key_files = vec![public("rsa")]);
    assert_eq!(
        check(&mut rsa_only, &forged, SUB, "s", NOW),
        invalid(Invalid::AlgNotAccepted)
    );
    // With an HS256 secret configured too, the token is tried against the secret only.
    let (mut both, _dir) = hs_auth(|s| s.public_key_files = vec![public("rsa")]);
    assert_eq!(
        check(&mut both, &forged, SUB, "s", NOW),
        invalid(Invalid::BadSignature)
    );
}

#[test]
fn alg_must_match_a_configured_key() {
    let mut ed_only = auth_with(|s| s.public_key_files = vec![public("ed")]);
    let es = sign(
        Algorithm::ES256,
        &signing_key("ec", Algorithm::ES256),
        &claims("a", EXP, &[], &["s"]),
    );
    assert_eq!(
        check(&mut ed_only, &es, SUB, "s", NOW),
        invalid(Invalid::AlgNotAccepted)
    );
    let (mut hs_only, _dir) = hs_auth(|_| {});
    let rs = sign(
        Algorithm::RS256,
        &signing_key("rsa", Algorithm::RS256),
        &claims("a", EXP, &[], &["s"]),
    );
    assert_eq!(
        check(&mut hs_only, &rs, SUB, "s", NOW),
        invalid(Invalid::AlgNotAccepted)
    );
    let hs512 = sign(
        Algorithm::HS512,
        &EncodingKey::from_secret(SECRET_A).unwrap(),
        &claims("a", EXP, &[], &["s"]),
    );
    assert_eq!(
        check(&mut hs_only, &hs512, SUB, "s", NOW),
        invalid(Invalid::AlgNotAccepted)
    );
}

#[test]
fn wrong_key_is_a_bad_signature() {
    let mut auth = auth_with(|s| s.public_key_files = vec![public("ec")]);
    let token = sign(
        Algorithm::ES256,
        &signing_key("ec_b", Algorithm::ES256),
        &claims("a", EXP, &[], &["s"]),
    );
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        invalid(Invalid::BadSignature)
    );
}

#[test]
fn expiry_has_no_leeway() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let token = sign_hs(SECRET_A, &claims("a", NOW, &[], &["s"]));
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        Err(Denied::Expired)
    );
    assert!(check(&mut auth, &token, SUB, "s", NOW - 1).is_ok());
    assert_eq!(Denied::Expired.status().0, 401);
}

#[test]
fn expired_forgery_is_a_bad_signature_not_expired() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let token = sign_hs(SECRET_B, &claims("a", NOW - 10, &[], &["s"]));
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        invalid(Invalid::BadSignature)
    );
}

#[test]
fn exp_is_required_and_must_be_a_date() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let no_exp = sign_hs(
        SECRET_A,
        &json!({ "sub": "a", "gateway": { "subscribe": ["*"] } }),
    );
    assert_eq!(
        check(&mut auth, &no_exp, SUB, "s", NOW),
        invalid(Invalid::MissingExp)
    );
    let text_exp = sign_hs(
        SECRET_A,
        &json!({ "exp": "tomorrow", "gateway": { "subscribe": ["*"] } }),
    );
    assert!(matches!(
        check(&mut auth, &text_exp, SUB, "s", NOW),
        Err(Denied::Invalid(_))
    ));
    let float_exp = sign_hs(
        SECRET_A,
        &json!({ "exp": EXP as f64 + 0.5, "gateway": { "subscribe": ["*"] } }),
    );
    assert_eq!(
        check(&mut auth, &float_exp, SUB, "s", NOW)
            .unwrap()
            .expires_unix_secs,
        Some(EXP)
    );
}

#[test]
fn nbf_is_honoured() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let token = sign_hs(
        SECRET_A,
        &json!({ "exp": EXP, "nbf": NOW + 10, "gateway": { "subscribe": ["s"] } }),
    );
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        invalid(Invalid::NotYetValid)
    );
    assert!(check(&mut auth, &token, SUB, "s", NOW + 10).is_ok());
    // Cached now; still refused before nbf.
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        invalid(Invalid::NotYetValid)
    );
}

#[test]
fn issuer_and_audience_when_configured() {
    let (mut auth, _dir) = hs_auth(|s| {
        s.issuer = Some("https://issuer.example".into());
        s.audience = Some("gateway".into());
    });
    let mk = |extra: serde_json::Value| {
        let mut c = claims("a", EXP, &[], &["s"]);
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        sign_hs(SECRET_A, &c)
    };
    let good = mk(json!({ "iss": "https://issuer.example", "aud": "gateway" }));
    assert!(check(&mut auth, &good, SUB, "s", NOW).is_ok());
    let aud_list = mk(json!({ "iss": "https://issuer.example", "aud": ["other", "gateway"] }));
    assert!(check(&mut auth, &aud_list, SUB, "s", NOW).is_ok());
    let cases = [
        (
            json!({ "iss": "https://evil.example", "aud": "gateway" }),
            Invalid::WrongIssuer,
        ),
        (json!({ "aud": "gateway" }), Invalid::WrongIssuer),
        (
            json!({ "iss": "https://issuer.example", "aud": "other" }),
            Invalid::WrongAudience,
        ),
        (
            json!({ "iss": "https://issuer.example", "aud": ["x", "y"] }),
            Invalid::WrongAudience,
        ),
        (
            json!({ "iss": "https://issuer.example" }),
            Invalid::WrongAudience,
        ),
    ];
    for (extra, why) in cases {
        let token = mk(extra.clone());
        assert_eq!(
            check(&mut auth, &token, SUB, "s", NOW),
            invalid(why),
            "{extra}"
        );
    }
}

#[test]
fn unconfigured_issuer_and_audience_are_not_checked() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let mut c = claims("a", EXP, &[], &["s"]);
    c["iss"] = json!("anyone");
    c["aud"] = json!(["anything"]);
    assert!(check(&mut auth, &sign_hs(SECRET_A, &c), SUB, "s", NOW).is_ok());
}

#[test]
fn tampered_payload_is_refused() {
    for (name, alg) in [
        ("ec", Algorithm::ES256),
        ("ed", Algorithm::EdDSA),
        ("rsa", Algorithm::RS256),
    ] {
        let mut auth = auth_with(|s| s.public_key_files = vec![public(name)]);
        let token = sign(
            alg,
            &signing_key(name, alg),
            &claims("a", EXP, &[], &["mine"]),
        );
        let parts: Vec<&str> = token.split('.').collect();
        let grown = URL_SAFE_NO_PAD.encode(claims("a", EXP, &["*"], &["*"]).to_string());
        let tampered = format!("{}.{grown}.{}", parts[0], parts[2]);
        assert_eq!(
            check(&mut auth, &tampered, SUB, "theirs", NOW),
            invalid(Invalid::BadSignature)
        );
        assert_eq!(
            check(&mut auth, &tampered, Action::Publish, "x", NOW),
            invalid(Invalid::BadSignature)
        );
        assert_eq!(
            check(&mut auth, &token, SUB, "theirs", NOW),
            Err(Denied::Forbidden)
        );
    }
}

#[test]
fn tampered_header_is_refused() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let token = sign_hs(SECRET_A, &claims("a", EXP, &[], &["s"]));
    let (_, rest) = token.split_once('.').unwrap();
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","kid":"x"}"#);
    let tampered = format!("{header}.{rest}");
    assert_eq!(
        check(&mut auth, &tampered, SUB, "s", NOW),
        invalid(Invalid::BadSignature)
    );
}

#[test]
fn oversized_token_is_refused_before_decoding() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let mut c = claims("a", EXP, &[], &["s"]);
    c["pad"] = json!("x".repeat(TOKEN_BYTES_MAX));
    let token = sign_hs(SECRET_A, &c);
    assert!(token.len() > TOKEN_BYTES_MAX);
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        invalid(Invalid::TooLarge)
    );
    assert_eq!(auth.verifications(), 0, "refused before verification");
}

#[test]
fn malformed_tokens() {
    let (mut auth, _dir) = hs_auth(|_| {});
    for token in [
        "abc",
        "a.b",
        "a.b.c.d",
        "....",
        "eyJhbGciOiJIUzI1NiJ9.e30.AAAA",
    ] {
        assert!(
            matches!(
                check(&mut auth, token, SUB, "s", NOW),
                Err(Denied::Invalid(_))
            ),
            "{token}"
        );
    }
    assert_eq!(
        check(&mut auth, "a+b.c.d", SUB, "s", NOW),
        invalid(Invalid::BadCharacters)
    );
    assert_eq!(auth.cache_len(), 0);
}

#[test]
fn malformed_claims() {
    let (mut auth, _dir) = hs_auth(|_| {});
    for c in [
        json!({ "exp": EXP, "sub": 5 }),
        json!({ "exp": EXP, "gateway": { "subscribe": "s" } }),
        json!({ "exp": EXP, "gateway": { "subscribe": [1] } }),
        json!({ "exp": EXP, "gateway": ["s"] }),
    ] {
        let token = sign_hs(SECRET_A, &c);
        assert_eq!(
            check(&mut auth, &token, SUB, "s", NOW),
            invalid(Invalid::BadClaims),
            "{c}"
        );
    }
}

#[test]
fn pattern_limits_in_tokens() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let many: Vec<String> = (0..=auth::PATTERNS_MAX).map(|i| format!("s{i}")).collect();
    let token = sign_hs(
        SECRET_A,
        &json!({ "exp": EXP, "gateway": { "publish": many } }),
    );
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        invalid(Invalid::TooManyPatterns)
    );
    let long = "x".repeat(auth::PATTERN_BYTES_MAX + 1);
    let token = sign_hs(
        SECRET_A,
        &json!({ "exp": EXP, "gateway": { "subscribe": [long] } }),
    );
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW),
        invalid(Invalid::PatternTooLong)
    );
}

#[test]
fn rotation_tries_each_key_of_the_alg() {
    let dir = tempfile::tempdir().unwrap();
    let a = secret_file(dir.path(), "a", SECRET_A);
    let b = secret_file(dir.path(), "b", SECRET_B);
    let mut auth = auth_with(|s| {
        s.hs256_secret_files = vec![a, b];
        s.public_key_files = vec![public("ec"), public("ec_b")];
    });
    for secret in [SECRET_A, SECRET_B] {
        let token = sign_hs(secret, &claims("a", EXP, &[], &["s"]));
        assert!(check(&mut auth, &token, SUB, "s", NOW).is_ok());
    }
    for name in ["ec", "ec_b"] {
        let token = sign(
            Algorithm::ES256,
            &signing_key(name, Algorithm::ES256),
            &claims("a", EXP, &[], &["s"]),
        );
        assert!(check(&mut auth, &token, SUB, "s", NOW).is_ok(), "{name}");
    }
    let other = sign_hs(
        b"secret-c-0123456789abcdef0123456789abcdef",
        &claims("a", EXP, &[], &["s"]),
    );
    assert_eq!(
        check(&mut auth, &other, SUB, "s", NOW),
        invalid(Invalid::BadSignature)
    );
}

#[test]
fn denials_carry_the_rfc_6750_challenge() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let bad = sign_hs(SECRET_B, &claims("a", EXP, &[], &["s"]));
    let d = check(&mut auth, &bad, SUB, "s", NOW).unwrap_err();
    assert_eq!(
        d.www_authenticate(),
        Some("Bearer realm=\"gateway\", error=\"invalid_token\"")
    );
    let good = sign_hs(SECRET_A, &claims("a", EXP, &[], &["s"]));
    let d = check(&mut auth, &good, SUB, "other", NOW).unwrap_err();
    assert_eq!(d, Denied::Forbidden);
    assert_eq!(d.status().0, 403);
    assert_eq!(
        d.www_authenticate(),
        Some("Bearer realm=\"gateway\", error=\"insufficient_scope\"")
    );
    let d = auth.check(&NONE, SUB, "s", NOW).unwrap_err();
    assert_eq!(d, Denied::Missing);
    assert_eq!(d.www_authenticate(), Some("Bearer realm=\"gateway\""));
}

/// `--jwt-lifetime-max-secs`: a token whose `exp` is further away than the bound is refused
/// at verification; one within it passes; no bound by default.
#[test]
fn a_token_living_longer_than_the_bound_is_refused() {
    let (mut bounded, _d1) = hs_auth(|s| s.lifetime_max_secs = Some(3_600));
    let (mut unbounded, _d2) = hs_auth(|_| {});
    let long = sign_hs(SECRET_A, &claims("al", NOW + 3_601, &[], &["s"]));
    let short = sign_hs(SECRET_A, &claims("al", NOW + 3_600, &[], &["s"]));
    assert_eq!(
        check(&mut bounded, &long, SUB, "s", NOW),
        invalid(Invalid::LifetimeTooLong)
    );
    assert!(check(&mut bounded, &short, SUB, "s", NOW).is_ok());
    assert!(check(&mut unbounded, &long, SUB, "s", NOW).is_ok());
    let (status, code, _) = Denied::Invalid(Invalid::LifetimeTooLong).status();
    assert_eq!((status, code), (401, "invalid_token"));
}
