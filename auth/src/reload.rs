//! Keys that change while the process runs: the gateway reloads its key files on SIGHUP and
//! refreshes its JWKS sets on a thread of its own, and hands each new [`Verifier`] here; every
//! core's [`crate::Auth`] takes it up at its next check. A token whose `kid` no JWKS set knows
//! is reported here ([`Keys::note_unknown_kid`]) for the refreshing thread; what it does with
//! that (and how often) is the gateway's decision.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::Verifier;

/// Called on a core for each token refused as [`crate::Invalid::UnknownKid`]: must not block.
type UnknownKidHook = Box<dyn Fn() + Send + Sync>;

/// The current verifier and a generation that counts its replacements.
pub struct Keys {
    generation: AtomicU64,
    current: Mutex<Arc<Verifier>>,
    /// Held while a replacement is made from the current verifier ([`Keys::update`]), so a
    /// SIGHUP and a JWKS refresh at once do not lose one another's keys.
    updating: Mutex<()>,
    unknown_kids: AtomicU64,
    on_unknown_kid: OnceLock<UnknownKidHook>,
}

impl Keys {
    pub fn new(v: Arc<Verifier>) -> Keys {
        Keys {
            generation: AtomicU64::new(0),
            current: Mutex::new(v),
            updating: Mutex::new(()),
            unknown_kids: AtomicU64::new(0),
            on_unknown_kid: OnceLock::new(),
        }
    }

    /// Replaces the verifier (the old one stays in use until each core's next check).
    pub fn replace(&self, v: Arc<Verifier>) {
        let mut cur = self.current.lock().expect("keys lock");
        *cur = v;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Replaces the verifier by `f` of the current one, one update at a time. `Ok(None)` keeps
    /// the current verifier (no new generation: the cores' token caches stay); an error keeps
    /// it too and is returned. Whether a new verifier was installed is the `Ok` value.
    pub fn update<E>(
        &self,
        f: impl FnOnce(&Verifier) -> Result<Option<Verifier>, E>,
    ) -> Result<bool, E> {
        let _one_at_a_time = self.updating.lock().expect("keys update lock");
        let (_, cur) = self.current();
        match f(&cur)? {
            Some(v) => {
                self.replace(Arc::new(v));
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The generation and the verifier of it.
    pub fn current(&self) -> (u64, Arc<Verifier>) {
        let cur = self.current.lock().expect("keys lock");
        (self.generation(), cur.clone())
    }

    /// Sets what to call when a token's `kid` is unknown (once; later calls are ignored). It
    /// runs on a reactor core: it must only signal, never wait.
    pub fn on_unknown_kid(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_unknown_kid.set(Box::new(hook));
    }

    /// A token was refused for an unknown `kid`: counted, and the hook told.
    pub fn note_unknown_kid(&self) {
        self.unknown_kids.fetch_add(1, Ordering::Relaxed);
        if let Some(hook) = self.on_unknown_kid.get() {
            hook();
        }
    }

    /// Tokens refused for an unknown `kid` so far.
    pub fn unknown_kids(&self) -> u64 {
        self.unknown_kids.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keys")
            .field("generation", &self.generation())
            .field("unknown_kids", &self.unknown_kids())
            .finish_non_exhaustive()
    }
}
