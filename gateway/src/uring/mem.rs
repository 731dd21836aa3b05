//! The memory a send points at while the kernel reads it: [`Bytes`] (bytes whose address is
//! stable for the value's life), a vectored send's runs, iovecs and msghdr ([`Vectored`]), and
//! what a send completion hands back ([`SendMem`]). The driver holds these from submission to
//! completion; their fields are visible to it alone.

use std::rc::Rc;

use log_store::LogSlice;

/// Bytes a vectored send may point at: memory whose address does not change while the value
/// lives, even when the value itself is moved (a mapped log slice, a reference-counted
/// buffer, a static).
#[derive(Clone, Debug)]
pub enum Bytes {
    Log(LogSlice),
    Owned(Rc<[u8]>),
    Static(&'static [u8]),
}

impl Bytes {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Log(s) => s.as_bytes(),
            Bytes::Owned(b) => b,
            Bytes::Static(b) => b,
        }
    }
}

/// The memory of one vectored send: the runs it sends (each holding its bytes alive), the
/// iovec array and the msghdr the kernel reads. Reused across sends (cleared in between).
#[derive(Debug)]
pub struct Vectored {
    pub(super) runs: Vec<(Bytes, usize, usize)>,
    pub(super) iov: Vec<libc::iovec>,
    pub(super) msg: libc::msghdr,
    pub(super) ask_tx_ack: bool,
}

impl Default for Vectored {
    fn default() -> Self {
        Vectored {
            runs: Vec::new(),
            iov: Vec::new(),
            // SAFETY: msghdr is plain data; all-zero is a valid empty header.
            msg: unsafe { std::mem::zeroed() },
            ask_tx_ack: false,
        }
    }
}

/// Spare send memory kept for a core's next sends: a subscriber with nothing in flight holds
/// none of its own (an idle subscription costs no iovec or run arrays), and a busy core reuses
/// these instead of allocating per send. At most `SPARE_MAX` are kept per thread (per core):
/// enough for a fan-out's sends all in flight at once; each keeps arrays of at most
/// `SPARE_RUNS_MAX` runs (larger ones, from a long catch-up, are dropped), so the pool holds
/// about 1 MiB at most.
const SPARE_MAX: usize = 1024;
const SPARE_RUNS_MAX: usize = 16;

thread_local! {
    // Boxed as sends hand them to the driver (the msghdr's address must not move): a take
    // costs no allocation.
    #[allow(clippy::vec_box)]
    static SPARES: std::cell::RefCell<Vec<Box<Vectored>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Vectored {
    /// Send memory for one send: a spare of this thread's, or a new one.
    pub fn take() -> Box<Vectored> {
        SPARES.with_borrow_mut(Vec::pop).unwrap_or_default()
    }

    /// Gives back the memory of a completed send (cleared; dropped if the spares are full).
    pub fn give(mut v: Box<Vectored>) {
        v.clear();
        if v.runs.capacity() > SPARE_RUNS_MAX || v.iov.capacity() > SPARE_RUNS_MAX {
            (v.runs, v.iov) = (Vec::new(), Vec::new());
        }
        SPARES.with_borrow_mut(|spares| {
            if spares.len() < SPARE_MAX {
                spares.push(v);
            }
        });
    }
}

impl Vectored {
    /// Drops the runs of the last send.
    pub fn clear(&mut self) {
        self.runs.clear();
        self.iov.clear();
        self.ask_tx_ack = false;
    }

    /// Appends `bytes[off..off + len]`.
    pub fn push(&mut self, bytes: Bytes, off: usize, len: usize) {
        assert!(off + len <= bytes.as_slice().len(), "run within its bytes");
        self.runs.push((bytes, off, len));
    }

    /// Asks for a TX ACK timestamp of the send's last byte (a `SO_TIMESTAMPING` control message).
    pub fn ask_tx_ack(&mut self, ask: bool) {
        self.ask_tx_ack = ask;
    }

    /// Each run's bytes, in order (what the send carries).
    pub fn run_slices(&self) -> impl Iterator<Item = &[u8]> + Clone {
        self.runs
            .iter()
            .map(|(b, off, len)| &b.as_slice()[*off..off + len])
    }

    /// Bytes the send carries.
    pub fn len(&self) -> u64 {
        self.runs.iter().map(|r| r.2 as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Whether the send asks for a TX ACK timestamp (the simulator's kernel reports one only
    /// for such sends, as the real one does).
    pub fn asks_tx_ack(&self) -> bool {
        self.ask_tx_ack
    }

    /// The bytes the send carries, copied (for tests).
    #[cfg(test)]
    pub fn flatten(&self) -> Vec<u8> {
        self.runs
            .iter()
            .flat_map(|(b, off, len)| b.as_slice()[*off..off + len].to_vec())
            .collect()
    }
}

/// The memory of a send, handed back with its completion.
#[derive(Debug)]
pub enum SendMem {
    /// A buffer (sent from an offset).
    Buf(Vec<u8>),
    Vectored(Box<Vectored>),
}
