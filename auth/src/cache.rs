//! One core's cache of verified tokens: the exact token text to what verification found, so a
//! token's signature is checked once per core, not once per request. Bounded; never consults a
//! clock of its own (the caller's `now` decides what has expired).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::Arc;

use crate::token::Verified;

/// Verified tokens by their exact text, at most `entries_max` of them.
///
/// Policy: an entry is kept until evicted, and never used at or after its `exp` (the lookup
/// refuses it; see [`crate::Auth::check`]). Only an insert into a full cache does work: it
/// sweeps out the expired entries, then, if that freed fewer than an eighth of the slots,
/// evicts the oldest inserts (FIFO) until an eighth is free. A sweep costs O(entries_max) and
/// is followed by at least entries_max / 8 inserts before the next one: O(1) amortised per
/// insert. `map` and `order` always hold the same keys.
pub(crate) struct TokenCache {
    map: HashMap<Arc<str>, Verified, TailHash>,
    /// Keys in insertion order, oldest first.
    order: VecDeque<Arc<str>>,
    entries_max: usize,
}

/// Hashes the last [`TAIL_BYTES`] bytes of a token and its length, keyed (SipHash with a random
/// key, as std's maps): a JWT ends with its signature, which is what tells two tokens apart,
/// so hashing all of a ~200-byte token on every request buys nothing. Equality still compares
/// the whole text. Keys are only valid (signed) tokens; a lookup with a forged tail costs one
/// bucket's comparisons, as any lookup.
#[derive(Clone, Debug)]
struct TailHash(RandomState);

/// Bytes of a token's end that [`TailHash`] hashes.
const TAIL_BYTES: usize = 32;

impl BuildHasher for TailHash {
    type Hasher = Tail<<RandomState as BuildHasher>::Hasher>;

    fn build_hasher(&self) -> Self::Hasher {
        Tail(self.0.build_hasher())
    }
}

/// A hasher that takes only the tail of each byte string written to it.
struct Tail<H>(H);

impl<H: Hasher> Hasher for Tail<H> {
    fn finish(&self) -> u64 {
        self.0.finish()
    }

    fn write(&mut self, bytes: &[u8]) {
        let tail = &bytes[bytes.len().saturating_sub(TAIL_BYTES)..];
        self.0.write_usize(bytes.len());
        self.0.write(tail);
    }
}

impl TokenCache {
    /// An empty cache of at most `entries_max` entries (0: nothing is ever cached).
    pub(crate) fn new(entries_max: usize) -> TokenCache {
        TokenCache {
            map: HashMap::with_hasher(TailHash(RandomState::new())),
            order: VecDeque::new(),
            entries_max,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The entry for `token`, expired or not (the caller checks `exp` against its `now`).
    pub(crate) fn get(&self, token: &str) -> Option<&Verified> {
        self.map.get(token)
    }

    /// Caches a verified token. It must not be in the cache already.
    pub(crate) fn insert(&mut self, token: &str, verified: Verified, now_unix_secs: u64) {
        if self.entries_max == 0 {
            return;
        }
        debug_assert!(
            !self.map.contains_key(token),
            "a cached token is never verified again"
        );
        if self.map.len() >= self.entries_max {
            self.make_room(now_unix_secs);
        }
        let key: Arc<str> = Arc::from(token);
        self.order.push_back(Arc::clone(&key));
        self.map.insert(key, verified);
        assert!(
            self.map.len() <= self.entries_max,
            "token cache past its bound"
        );
        debug_assert_eq!(self.map.len(), self.order.len());
    }

    /// Frees at least one slot, and at least an eighth of them (see the type's doc).
    fn make_room(&mut self, now_unix_secs: u64) {
        self.map.retain(|_, v| now_unix_secs < v.exp_unix_secs);
        let map = &self.map;
        self.order.retain(|k| map.contains_key(k));
        let slack = (self.entries_max / 8).max(1);
        let target = self.entries_max - slack;
        while self.map.len() > target {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.map.remove(&oldest);
        }
    }
}

impl std::fmt::Debug for TokenCache {
    /// Sizes only: the keys are bearer tokens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache")
            .field("len", &self.map.len())
            .field("entries_max", &self.entries_max)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::Grants;

    fn verified(exp: u64) -> Verified {
        Verified {
            issuer: None,
            subject: None,
            mcp: false,
            exp_unix_secs: exp,
            nbf_unix_secs: None,
            grants: Grants::default(),
        }
    }

    #[test]
    fn bound_holds_and_expired_go_first() {
        let mut c = TokenCache::new(16);
        for i in 0..16 {
            // Half expire at 100, half live long.
            c.insert(
                &format!("t{i}"),
                verified(if i % 2 == 0 { 100 } else { 1000 }),
                50,
            );
        }
        assert_eq!(c.len(), 16);
        c.insert("new", verified(1000), 200);
        assert_eq!(
            c.len(),
            9,
            "the 8 expired entries were swept, none live evicted"
        );
        assert!(
            (0..16)
                .filter(|i| i % 2 == 1)
                .all(|i| c.get(&format!("t{i}")).is_some())
        );
        for i in 0..100 {
            c.insert(&format!("u{i}"), verified(1000), 200);
            assert!(c.len() <= 16);
        }
        assert!(c.get("u99").is_some(), "the newest insert is kept");
        assert_eq!(c.map.len(), c.order.len());
    }

    #[test]
    fn zero_caches_nothing() {
        let mut c = TokenCache::new(0);
        c.insert("t", verified(10), 0);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn one_entry() {
        let mut c = TokenCache::new(1);
        c.insert("a", verified(10), 0);
        c.insert("b", verified(10), 0);
        assert_eq!(c.len(), 1);
        assert!(c.get("b").is_some());
    }
}
