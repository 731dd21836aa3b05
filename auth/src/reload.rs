//! Keys that change while the process runs: the gateway reloads its key files on SIGHUP and
//! hands the new [`Verifier`] here; every core's [`crate::Auth`] takes it up at its next check.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::Verifier;

/// The current verifier and a generation that counts its replacements.
#[derive(Debug)]
pub struct Keys {
    generation: AtomicU64,
    current: Mutex<Arc<Verifier>>,
}

impl Keys {
    pub fn new(v: Arc<Verifier>) -> Keys {
        Keys {
            generation: AtomicU64::new(0),
            current: Mutex::new(v),
        }
    }

    /// Replaces the verifier (the old one stays in use until each core's next check).
    pub fn replace(&self, v: Arc<Verifier>) {
        let mut cur = self.current.lock().expect("keys lock");
        *cur = v;
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The generation and the verifier of it.
    pub fn current(&self) -> (u64, Arc<Verifier>) {
        let cur = self.current.lock().expect("keys lock");
        (self.generation(), cur.clone())
    }
}
