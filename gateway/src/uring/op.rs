//! What an io_uring operation is, and how its `user_data` names it.
//!
//! `user_data = slot (24 bits) | generation (16) | serial (20) | op (4)`. The slot is a
//! connection's place in the op table; the generation tells the slot's successive
//! connections apart; the serial numbers every operation issued on the slot (it continues
//! across the slot's connections), so a completion can be matched to exactly one submission.
//! Core-wide operations (accept, the eventfd read, cancels) use slot 0 and generation 0; accept
//! and the eventfd read carry a serial per arming, cancels serial 0.
#![forbid(unsafe_code)]

/// Slots a core can hold (`--connections-max` is capped below this).
pub const SLOTS_MAX: usize = 1 << 24;
/// Bits of a slot's generation carried in user_data.
pub const GEN_MASK: u32 = 0xffff;
/// Bits of an operation's serial carried in user_data.
pub const SERIAL_MASK: u32 = 0xf_ffff;

/// One kind of operation the reactor submits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Multishot accept on the core's listener.
    Accept,
    /// The 8-byte read armed on the core's eventfd (handoffs, shutdown).
    EventFd,
    /// A cancel: its own completion carries nothing.
    Cancel,
    /// A connection's receive into its request buffer.
    Recv,
    /// A connection's send (`SEND` of a buffer, or `SENDMSG` of iovecs into the log).
    Send,
    /// A single-shot `POLLOUT` wait after a partial subscriber send.
    PollOut,
    /// A subscriber's multishot `SOCKET_URING_OP_TX_TIMESTAMP` command.
    TxTimestamps,
    /// A subscriber's multishot `POLLIN | POLLRDHUP` watch.
    Watch,
    /// An `fdatasync` of a log segment (a group commit); its slot field names the shard.
    Fsync,
    /// A subscriber's read-ahead of cold log pages (into a scratch buffer) before a send.
    Prefetch,
    /// A `syncfs` covering several shards' group commits; its slot field names the round.
    SyncFs,
}

impl Op {
    /// The per-connection operations, in op-table order.
    pub const CONN: [Op; 6] = [
        Op::Recv,
        Op::Send,
        Op::PollOut,
        Op::TxTimestamps,
        Op::Watch,
        Op::Prefetch,
    ];

    fn code(self) -> u8 {
        match self {
            Op::Accept => 1,
            Op::EventFd => 2,
            Op::Recv => 3,
            Op::Send => 4,
            Op::PollOut => 5,
            Op::TxTimestamps => 6,
            Op::Cancel => 7,
            Op::Watch => 8,
            Op::Fsync => 9,
            Op::Prefetch => 10,
            Op::SyncFs => 11,
        }
    }

    fn from_code(c: u8) -> Option<Op> {
        Some(match c {
            1 => Op::Accept,
            2 => Op::EventFd,
            3 => Op::Recv,
            4 => Op::Send,
            5 => Op::PollOut,
            6 => Op::TxTimestamps,
            7 => Op::Cancel,
            8 => Op::Watch,
            9 => Op::Fsync,
            10 => Op::Prefetch,
            11 => Op::SyncFs,
            _ => return None,
        })
    }

    /// The operation's index in a slot's op table (per-connection operations only).
    pub fn conn_index(self) -> Option<usize> {
        match self {
            Op::Recv => Some(0),
            Op::Send => Some(1),
            Op::PollOut => Some(2),
            Op::TxTimestamps => Some(3),
            Op::Watch => Some(4),
            Op::Prefetch => Some(5),
            Op::Accept | Op::EventFd | Op::Cancel | Op::Fsync | Op::SyncFs => None,
        }
    }

    /// Whether the kernel may read or write connection memory (or use the fd) until this
    /// operation's last completion: the slot is freed only when none of these is in flight.
    /// The TX-timestamp command points at nothing of ours; a late completion of it is stale.
    pub fn owns_memory(self) -> bool {
        matches!(
            self,
            Op::Recv | Op::Send | Op::PollOut | Op::Watch | Op::Prefetch
        )
    }

    /// Multishot: stays in flight while its completions carry `IORING_CQE_F_MORE`.
    pub fn multishot(self) -> bool {
        matches!(self, Op::Accept | Op::TxTimestamps | Op::Watch)
    }
}

/// The decoded `user_data` of a submission or completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserData {
    pub slot: u32,
    pub generation: u32,
    pub serial: u32,
    pub op: Op,
}

impl UserData {
    /// A core-wide operation's user_data (slot, generation and serial 0).
    pub fn core(op: Op) -> UserData {
        UserData {
            slot: 0,
            generation: 0,
            serial: 0,
            op,
        }
    }

    /// Packs the fields (each truncated to its width).
    pub fn pack(self) -> u64 {
        (u64::from(self.slot & 0xff_ffff) << 40)
            | (u64::from(self.generation & GEN_MASK) << 24)
            | (u64::from(self.serial & SERIAL_MASK) << 4)
            | u64::from(self.op.code() & 0x0f)
    }

    /// Unpacks a user_data; `None` for an op code the reactor never issues.
    pub fn unpack(u: u64) -> Option<UserData> {
        Some(UserData {
            slot: (u >> 40) as u32,
            generation: ((u >> 24) as u32) & GEN_MASK,
            serial: ((u >> 4) as u32) & SERIAL_MASK,
            op: Op::from_code((u & 0x0f) as u8)?,
        })
    }
}

/// Advances a slot's serial counter and returns the new serial (wraps at 2^20).
pub fn next_serial(counter: &mut u32) -> u32 {
    *counter = counter.wrapping_add(1) & SERIAL_MASK;
    *counter
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn op_strategy() -> impl Strategy<Value = Op> {
        (1u8..=11).prop_map(|c| Op::from_code(c).expect("valid code"))
    }

    proptest! {
        /// Every field survives the round trip, within its width.
        #[test]
        fn user_data_round_trips(slot in 0u32..(SLOTS_MAX as u32), generation: u32, serial: u32, op in op_strategy()) {
            let u = UserData { slot, generation, serial, op };
            let back = UserData::unpack(u.pack()).expect("known op");
            prop_assert_eq!(back, UserData { slot, generation: generation & GEN_MASK, serial: serial & SERIAL_MASK, op });
        }
    }

    /// Two operations of one slot fewer than 2^20 apart never share a user_data: a stray
    /// completion of an earlier one cannot pass for the one in flight unless 2^20 operations
    /// separate them.
    #[test]
    fn consecutive_serials_differ_until_they_wrap() {
        let mut seen = std::collections::HashSet::new();
        let mut counter = 0u32;
        let ud = |serial| {
            UserData {
                slot: 7,
                generation: 3,
                serial,
                op: Op::Send,
            }
            .pack()
        };
        for _ in 0..=SERIAL_MASK {
            let serial = next_serial(&mut counter);
            assert!(seen.insert(ud(serial)));
        }
        let serial = next_serial(&mut counter);
        assert!(!seen.insert(ud(serial)), "wraps at 2^20");
    }

    #[test]
    fn conn_indices_follow_the_table_order() {
        for (i, op) in Op::CONN.into_iter().enumerate() {
            assert_eq!(op.conn_index(), Some(i));
        }
        assert_eq!(Op::Accept.conn_index(), None);
    }

    #[test]
    fn unknown_op_codes_are_refused() {
        for code in [0u64, 12, 15] {
            assert_eq!(UserData::unpack(code), None);
        }
    }

    #[test]
    fn only_the_timestamp_command_owns_no_memory() {
        let free: Vec<Op> = Op::CONN.into_iter().filter(|o| !o.owns_memory()).collect();
        assert_eq!(free, vec![Op::TxTimestamps]);
    }
}
