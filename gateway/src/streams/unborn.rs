//! Subscribers of streams that do not exist yet ("unborn"), by name: a subscribe creates
//! nothing and takes no place under `--streams-max`; it waits here, registered in the hub
//! under its shard's `PENDING_STREAM` key, until the stream's first publish (single node) or
//! the first applied message that names it (cluster mode) creates it, and its subscribers move
//! to the new stream. One registry for both modes. No I/O.
#![forbid(unsafe_code)]

use std::collections::HashMap;

use super::SubRef;

/// The connections waiting for each unborn stream, and each one's stream.
#[derive(Debug, Default)]
pub struct Unborn {
    by_name: HashMap<String, Vec<SubRef>>,
    of: HashMap<SubRef, String>,
}

impl Unborn {
    /// `r` waits for `stream` (a connection waits for one stream at most).
    pub fn wait(&mut self, stream: &str, r: SubRef) {
        self.forget(r);
        self.by_name.entry(stream.to_owned()).or_default().push(r);
        self.of.insert(r, stream.to_owned());
    }

    /// `r`'s connection closed: it waits no more.
    pub fn forget(&mut self, r: SubRef) {
        let Some(name) = self.of.remove(&r) else {
            return;
        };
        if let Some(list) = self.by_name.get_mut(&name) {
            list.retain(|&x| x != r);
            if list.is_empty() {
                self.by_name.remove(&name);
            }
        }
    }

    /// The connections waiting for `stream`.
    pub fn subs(&self, stream: &str) -> &[SubRef] {
        self.by_name.get(stream).map_or(&[], Vec::as_slice)
    }

    /// `stream` was born: its waiting connections, which wait no more.
    pub fn take(&mut self, stream: &str) -> Vec<SubRef> {
        let subs = self.by_name.remove(stream).unwrap_or_default();
        for r in &subs {
            self.of.remove(r);
        }
        subs
    }

    /// Connections waiting, over all unborn streams.
    pub fn len(&self) -> usize {
        self.of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.of.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_are_taken_once_by_their_stream_and_forgotten_on_close() {
        let mut u = Unborn::default();
        u.wait("a", (1, 0));
        u.wait("a", (2, 0));
        u.wait("b", (3, 0));
        u.forget((2, 0));
        assert_eq!(u.subs("a"), &[(1, 0)]);
        assert_eq!(u.take("a"), vec![(1, 0)]);
        assert!(u.take("a").is_empty(), "taken once");
        u.forget((1, 0)); // closing after the birth: nothing left to forget
        assert_eq!(u.len(), 1);
        u.wait("c", (3, 0));
        assert!(u.subs("b").is_empty(), "one stream per connection");
        u.forget((3, 0));
        assert!(u.is_empty());
    }
}
