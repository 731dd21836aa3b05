//! [`ByteTail`]: the last N bytes of a byte stream, for diagnostics (what a connection said
//! just before it stopped making sense). Pure; no allocation once the buffer reached its size.

/// Keeps the most recent `cap` bytes pushed (and counts all of them).
#[derive(Debug)]
pub struct ByteTail {
    buf: Vec<u8>,
    cap: usize,
    total: u64,
}

impl ByteTail {
    pub fn new(cap: usize) -> ByteTail {
        ByteTail {
            buf: Vec::with_capacity(2 * cap),
            cap,
            total: 0,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let bytes = &bytes[bytes.len().saturating_sub(self.cap)..];
        if self.buf.len() + bytes.len() > 2 * self.cap {
            // Keep room to append without growing: drop all but the newest cap - len bytes.
            let keep = self.cap - bytes.len();
            let from = self.buf.len() - keep.min(self.buf.len());
            self.buf.drain(..from);
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The newest bytes, at most `cap` of them, oldest first.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.buf.len().saturating_sub(self.cap)..]
    }

    /// Bytes pushed in all.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn keeps_exactly_the_newest_bytes(
            cap in 1usize..64,
            pushes in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..100), 0..40),
        ) {
            let mut t = ByteTail::new(cap);
            let mut all = Vec::new();
            for p in &pushes {
                t.push(p);
                all.extend_from_slice(p);
                prop_assert_eq!(t.bytes(), &all[all.len().saturating_sub(cap)..]);
                prop_assert_eq!(t.total(), all.len() as u64);
                prop_assert!(t.buf.capacity() <= 2 * cap.max(1) + 100);
            }
        }
    }
}
