//! Key rotation without a restart: SIGHUP reads the JWT key files again. A token of the new
//! key works at once, a token of the dropped key is refused from then on (each core's token
//! cache is emptied), a subscription opened with the old key keeps streaming, and a key file
//! that no longer loads keeps the keys in use.
#![forbid(unsafe_code)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Gateway, Sse, request};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::json;

const OLD: &[u8] = b"the old hs256 secret, at least thirty-two bytes long";
const NEW: &[u8] = b"the new hs256 secret, at least thirty-two bytes long too";

fn token(secret: &[u8]) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let claims = json!({"sub": "rotator", "exp": exp,
        "gateway": {"publish": ["*"], "subscribe": ["*"]}});
    let key = EncodingKey::from_secret(secret).unwrap();
    encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap()
}

fn publish(g: &Gateway, secret: &[u8], data: &str) -> u16 {
    let auth = format!("Bearer {}", token(secret));
    let headers = [("Authorization", auth.as_str())];
    request(
        g.addr,
        "POST",
        "/v1/streams/rot/events",
        &headers,
        data.as_bytes(),
    )
    .0
}

/// Publishes with `secret` until the answer is `want` (the reload is asynchronous to the
/// request path), at most 10 s.
fn until_status(g: &Gateway, secret: &[u8], want: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = publish(g, secret, "probe");
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {got}, want {want}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_rotates_the_jwt_keys_without_dropping_a_subscription() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("hs256.secret");
    std::fs::write(&secret, OLD).unwrap();
    let g = Gateway::start(&[
        "--jwt-hs256-secret-file",
        secret.to_str().unwrap(),
        "--cores",
        "2",
    ]);
    assert_eq!(publish(&g, OLD, "first"), 201);
    assert_eq!(publish(&g, NEW, "refused"), 401);
    let old_auth = format!("Bearer {}", token(OLD));
    let mut sse = Sse::open_with(
        g.addr,
        "/v1/streams/rot",
        None,
        &[("Authorization", &old_auth)],
    );
    assert_eq!(sse.status, 200);

    std::fs::write(&secret, NEW).unwrap();
    g.signal("HUP");
    until_status(&g, NEW, 201);
    assert_eq!(publish(&g, OLD, "dropped key"), 401);
    assert_eq!(publish(&g, NEW, "after rotation"), 201);
    // The subscription opened with the old key kept going: it sees the events published
    // after the rotation (its token is valid until its exp).
    let mut seen = Vec::new();
    while !seen.iter().any(|d: &String| d == "after rotation") {
        let ev = sse.next_event().expect("the subscription stayed open");
        seen.push(ev.data);
    }

    // A key file that no longer loads (too short a secret) keeps the keys in use.
    std::fs::write(&secret, b"short").unwrap();
    g.signal("HUP");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(publish(&g, NEW, "still the new key"), 201);
}
