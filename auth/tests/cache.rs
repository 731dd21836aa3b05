//! The per-core token cache, seen through `Auth`: hits skip verification, entries die at `exp`,
//! the bound holds, and invalid tokens never get in.

mod common;

use auth::{Action, Denied, Invalid};
use common::*;
use jsonwebtoken::Algorithm;

const SUB: Action = Action::Subscribe;

#[test]
fn a_cached_token_is_not_verified_again() {
    let mut auth = auth_with(|s| s.public_key_files = vec![public("ec")]);
    let token = sign(
        Algorithm::ES256,
        &signing_key("ec", Algorithm::ES256),
        &claims("a", EXP, &[], &["s", "t"]),
    );
    assert!(check(&mut auth, &token, SUB, "s", NOW).is_ok());
    assert_eq!((auth.verifications(), auth.cache_len()), (1, 1));
    assert!(check(&mut auth, &token, SUB, "t", NOW + 1).is_ok());
    assert_eq!(
        check(&mut auth, &token, SUB, "u", NOW + 2),
        Err(Denied::Forbidden)
    );
    assert!(auth.authenticate(&header(&bearer(&token)), NOW + 3).is_ok());
    assert_eq!((auth.verifications(), auth.cache_len()), (1, 1));
}

#[test]
fn a_cached_token_past_exp_is_refused() {
    let (mut auth, _dir) = hs_auth(|_| {});
    let token = sign_hs(SECRET_A, &claims("a", NOW + 10, &[], &["s"]));
    assert!(check(&mut auth, &token, SUB, "s", NOW).is_ok());
    assert_eq!(auth.cache_len(), 1);
    assert!(check(&mut auth, &token, SUB, "s", NOW + 9).is_ok());
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW + 10),
        Err(Denied::Expired)
    );
    assert_eq!(
        check(&mut auth, &token, SUB, "s", NOW + 1000),
        Err(Denied::Expired)
    );
    assert_eq!(
        auth.authenticate(&header(&bearer(&token)), NOW + 10),
        Err(Denied::Expired)
    );
    assert_eq!(auth.verifications(), 1, "refused from the cache");
}

#[test]
fn the_bound_holds_under_three_times_the_entries() {
    const MAX: usize = 64;
    let (mut auth, _dir) = hs_auth(|s| s.cache_entries_max = MAX);
    let mut high = 0;
    for i in 0..3 * MAX {
        let token = sign_hs(SECRET_A, &claims(&format!("u{i}"), EXP, &[], &["s"]));
        assert!(check(&mut auth, &token, SUB, "s", NOW).is_ok());
        high = high.max(auth.cache_len());
        assert!(
            auth.cache_len() <= MAX,
            "{} entries after {i} inserts",
            auth.cache_len()
        );
    }
    assert_eq!(high, MAX, "the cache fills up to its bound");
    // The newest entry survived eviction.
    let last = sign_hs(
        SECRET_A,
        &claims(&format!("u{}", 3 * MAX - 1), EXP, &[], &["s"]),
    );
    let before = auth.verifications();
    assert!(check(&mut auth, &last, SUB, "s", NOW).is_ok());
    assert_eq!(auth.verifications(), before);
}

#[test]
fn expired_entries_make_room_first() {
    const MAX: usize = 16;
    let (mut auth, _dir) = hs_auth(|s| s.cache_entries_max = MAX);
    let long: Vec<String> = (0..MAX / 2)
        .map(|i| sign_hs(SECRET_A, &claims(&format!("l{i}"), EXP, &[], &["s"])))
        .collect();
    for (i, t) in long.iter().enumerate() {
        assert!(check(&mut auth, t, SUB, "s", NOW).is_ok());
        let short = sign_hs(SECRET_A, &claims(&format!("s{i}"), NOW + 5, &[], &["s"]));
        assert!(check(&mut auth, &short, SUB, "s", NOW).is_ok());
    }
    assert_eq!(auth.cache_len(), MAX);
    let fresh = sign_hs(SECRET_A, &claims("fresh", EXP, &[], &["s"]));
    assert!(check(&mut auth, &fresh, SUB, "s", NOW + 5).is_ok());
    assert_eq!(
        auth.cache_len(),
        MAX / 2 + 1,
        "only the expired entries went"
    );
    let before = auth.verifications();
    for t in &long {
        assert!(check(&mut auth, t, SUB, "s", NOW + 5).is_ok());
    }
    assert_eq!(
        auth.verifications(),
        before,
        "every long-lived entry is still cached"
    );
}

#[test]
fn invalid_tokens_are_not_cached() {
    let (mut auth, _dir) = hs_auth(|s| s.cache_entries_max = 8);
    for i in 0..20 {
        let forged = sign_hs(SECRET_B, &claims(&format!("m{i}"), EXP, &[], &["s"]));
        assert_eq!(
            check(&mut auth, &forged, SUB, "s", NOW),
            Err(Denied::Invalid(Invalid::BadSignature))
        );
        let expired = sign_hs(SECRET_A, &claims(&format!("e{i}"), NOW - 1, &[], &["s"]));
        assert_eq!(
            check(&mut auth, &expired, SUB, "s", NOW),
            Err(Denied::Expired)
        );
    }
    assert_eq!(auth.cache_len(), 0);
    // A forged token is verified (and refused) every time.
    let forged = sign_hs(SECRET_B, &claims("m", EXP, &[], &["s"]));
    let before = auth.verifications();
    let _ = check(&mut auth, &forged, SUB, "s", NOW);
    let _ = check(&mut auth, &forged, SUB, "s", NOW);
    assert_eq!(auth.verifications(), before + 2);
}

#[test]
fn a_zero_bound_disables_the_cache() {
    let (mut auth, _dir) = hs_auth(|s| s.cache_entries_max = 0);
    let token = sign_hs(SECRET_A, &claims("a", EXP, &[], &["s"]));
    assert!(check(&mut auth, &token, SUB, "s", NOW).is_ok());
    assert!(check(&mut auth, &token, SUB, "s", NOW).is_ok());
    assert_eq!((auth.cache_len(), auth.verifications()), (0, 2));
}

#[test]
fn each_core_has_its_own_cache() {
    let (mut a, _dir) = hs_auth(|_| {});
    let mut b = auth::Auth::new(a.verifier().clone());
    let token = sign_hs(SECRET_A, &claims("a", EXP, &[], &["s"]));
    assert!(check(&mut a, &token, SUB, "s", NOW).is_ok());
    assert_eq!(b.cache_len(), 0);
    assert!(check(&mut b, &token, SUB, "s", NOW).is_ok());
    assert_eq!((a.cache_len(), b.cache_len()), (1, 1));
}
