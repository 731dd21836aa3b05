//! The JWKS parser on hand-made documents: each kind of key taken, each reason to skip a key,
//! each reason to refuse a document. (Signatures verified through JWKS keys: tests/jwks.rs.)

use serde_json::{Value, json};

use super::*;

/// The P-256 base point (a valid public point).
const P256_X: &str = "axfR8uEsQkf4vOblY6RA8ncDfYEt6zOg9KE5RdiYwpY";
const P256_Y: &str = "T-NC4v4af5uO5-tKfA-eFivOM1drMV7Oy7ZAaDe_UfU";
/// The Ed25519 base point's encoding.
const ED_X: &str = "WGZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmY";

/// An odd modulus of `bits` bits (not a real RSA key; enough to build a verifier).
fn modulus(bits: usize) -> String {
    let mut n = vec![0xC5u8; bits / 8];
    *n.last_mut().unwrap() |= 1;
    URL_SAFE_NO_PAD.encode(n)
}

fn rsa(kid: &str) -> Value {
    json!({"kty": "RSA", "kid": kid, "n": modulus(2048), "e": "AQAB"})
}

fn ec(kid: &str) -> Value {
    json!({"kty": "EC", "crv": "P-256", "kid": kid, "x": P256_X, "y": P256_Y})
}

fn ed(kid: &str) -> Value {
    json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": ED_X})
}

fn doc(keys: &[Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({ "keys": keys })).unwrap()
}

/// The one reason `key` is skipped, next to a usable key.
fn skip_reason(key: Value) -> String {
    let (set, skipped) = parse(&doc(&[ec("good"), key])).unwrap();
    assert_eq!(set.len(), 1);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].index, 1);
    skipped[0].why.clone()
}

fn with(mut key: Value, field: &str, v: Value) -> Value {
    key[field] = v;
    key
}

#[test]
fn each_kind_of_key_is_taken() {
    let (set, skipped) = parse(&doc(&[rsa("r"), ec("e"), ed("d")])).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(
        set.describe(),
        vec![
            (Some("r"), KeyAlg::Rs256),
            (Some("e"), KeyAlg::Es256),
            (Some("d"), KeyAlg::EdDsa)
        ]
    );
    assert!(set.knows_kid("e") && !set.knows_kid("x"));
    // A matching alg, use sig and key_ops with verify are fine; a key without kid is kept.
    let fine = with(with(rsa("r"), "alg", json!("RS256")), "use", json!("sig"));
    let fine = with(fine, "key_ops", json!(["verify"]));
    let no_kid = json!({"kty": "EC", "crv": "P-256", "x": P256_X, "y": P256_Y});
    let (set, skipped) = parse(&doc(&[fine, no_kid])).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(set.describe()[1], (None, KeyAlg::Es256));
}

#[test]
fn secrets_and_private_keys_are_skipped() {
    let oct =
        json!({"kty": "oct", "kid": "s", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA"});
    assert!(skip_reason(oct).contains("oct"));
    assert!(skip_reason(with(ec("e"), "k", json!("AAAA"))).contains("oct"));
    assert!(skip_reason(with(ec("e"), "d", json!("AAAA"))).contains("private"));
}

#[test]
fn unusable_keys_are_skipped_with_a_reason() {
    let cases: Vec<(Value, &str)> = vec![
        (with(ec("e"), "use", json!("enc")), "use \"enc\""),
        (with(ec("e"), "key_ops", json!(["sign"])), "verify"),
        (with(rsa("r"), "alg", json!("RS512")), "RS512"),
        (with(rsa("r"), "alg", json!("PS256")), "PS256"),
        (with(ec("e"), "alg", json!("RS256")), "RS256"),
        (with(ed("d"), "alg", json!("none")), "none"),
        (with(ec("e"), "crv", json!("P-384")), "P-384"),
        (with(ed("d"), "crv", json!("X25519")), "X25519"),
        (
            json!({"kty": "RSA", "kid": "r", "n": modulus(1024), "e": "AQAB"}),
            "1024 bits",
        ),
        (json!({"kty": "RSA", "kid": "r", "e": "AQAB"}), "without n"),
        (
            json!({"kty": "RSA", "kid": "r", "n": "!!", "e": "AQAB"}),
            "base64url",
        ),
        (
            json!({"kty": "RSA", "kid": "r", "n": modulus(2048), "e": "AA"}),
            "zero",
        ),
        (with(ec("e"), "x", json!("AAAA")), "32 bytes"),
        (with(ed("d"), "x", json!("AAAA")), "32 bytes"),
        (json!({"kid": "k"}), "no kty"),
        (json!({"kty": "XYZ"}), "XYZ"),
        (with(ec("e"), "kid", json!(7)), "not a string"),
        (
            with(ec("e"), "kid", json!("k".repeat(KID_BYTES_MAX + 1))),
            "longer",
        ),
        (json!("a string"), "malformed"),
        (with(ec("e"), "use", json!(1)), "malformed"),
    ];
    for (key, want) in cases {
        let why = skip_reason(key.clone());
        assert!(why.contains(want), "{key}: {why:?} lacks {want:?}");
    }
}

#[test]
fn broken_documents_are_refused() {
    for bad in [
        &b"not json"[..],
        b"[]",
        b"{}",
        b"{\"keys\": 1}",
        b"{\"keys\": [1]} x",
    ] {
        assert!(
            matches!(parse(bad), Err(JwksError::Malformed(_))),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert_eq!(
        parse(&doc(&[])),
        Err(JwksError::NoUsableKey { skipped: vec![] })
    );
    let only_bad = doc(&[with(ec("e"), "use", json!("enc"))]);
    let err = parse(&only_bad).unwrap_err();
    assert!(matches!(&err, JwksError::NoUsableKey { skipped } if skipped.len() == 1));
    assert!(err.to_string().contains("kid \"e\""), "{err}");
    let many: Vec<Value> = (0..=KEYS_MAX).map(|i| ec(&i.to_string())).collect();
    assert_eq!(
        parse(&doc(&many)),
        Err(JwksError::TooManyKeys {
            count: KEYS_MAX + 1
        })
    );
}

#[test]
fn equal_sets_are_the_same_keys() {
    let a = parse(&doc(&[rsa("r"), ec("e")])).unwrap().0;
    let again = parse(&doc(&[rsa("r"), ec("e")])).unwrap().0;
    let renamed = parse(&doc(&[rsa("r"), ec("f")])).unwrap().0;
    let fewer = parse(&doc(&[rsa("r")])).unwrap().0;
    assert_eq!(a, again);
    assert_ne!(a, renamed);
    assert_ne!(a, fewer);
    // Debug output names ids and algorithms only.
    let shown = format!("{a:?}");
    assert!(
        shown.contains("\"r\"") && !shown.contains(&modulus(2048)[..20]),
        "{shown}"
    );
}

mod props {
    use proptest::prelude::*;

    use super::*;

    /// A JSON value for one JWK field: a string from a small alphabet of meaningful and
    /// broken values, a number, or null.
    fn field() -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::sample::select(vec![
                "RSA", "EC", "OKP", "oct", "P-256", "Ed25519", "sig", "enc", "RS256", "ES256",
                "EdDSA", "AQAB", "AA", "", "!!", P256_X, P256_Y, ED_X,
            ])
            .prop_map(|s| json!(s)),
            any::<i64>().prop_map(|n| json!(n)),
            Just(Value::Null),
            "[A-Za-z0-9_-]{0,90}".prop_map(|s| json!(s)),
        ]
    }

    const FIELDS: [&str; 12] = [
        "kty", "crv", "kid", "use", "alg", "n", "e", "x", "y", "d", "k", "key_ops",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Any bytes: a result, never a panic.
        #[test]
        fn any_bytes_parse_or_are_refused(doc in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&doc);
        }

        /// Keys of random fields: each is taken or skipped with a reason (never a panic), and
        /// a taken key is a public signature key of one of the three algorithms.
        #[test]
        fn random_keys_are_taken_or_skipped(
            keys in prop::collection::vec(
                prop::collection::btree_map(
                    prop::sample::select(FIELDS.to_vec()),
                    field(),
                    0..8,
                ),
                0..4,
            )
        ) {
            let keys: Vec<Value> = keys.into_iter().map(|m| json!(m)).collect();
            match parse(&doc(&keys)) {
                Ok((set, skipped)) => {
                    prop_assert_eq!(set.len() + skipped.len(), keys.len());
                    prop_assert!(skipped.iter().all(|s| !s.why.is_empty()));
                }
                Err(JwksError::NoUsableKey { skipped }) => {
                    prop_assert_eq!(skipped.len(), keys.len());
                }
                Err(e) => prop_assert!(false, "{}", e),
            }
        }
    }
}
