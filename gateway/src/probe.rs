//! io_uring feature probe run once at start: is io_uring present, allowed by
//! `kernel.io_uring_disabled`, not blocked by seccomp, and does it support every opcode the
//! reactor submits? Produces a [`ProbeError`] that names the cause. It does not build the
//! per-core rings (the reactor does).
#![forbid(unsafe_code)]

use std::fmt;

use io_uring::{IoUring, opcode, register::Probe};

/// Why io_uring cannot be used, named for the operator.
#[derive(Debug)]
pub enum ProbeError {
    /// `io_uring_setup` returned ENOSYS: kernel built without io_uring, or a seccomp filter
    /// (Docker's default profile) answers ENOSYS.
    NotImplemented,
    /// `kernel.io_uring_disabled` is 2 (io_uring disabled for everyone).
    DisabledBySysctl(u8),
    /// `io_uring_setup` returned EPERM: `kernel.io_uring_disabled` = 1 without the allowed
    /// group, or a seccomp filter.
    NotPermitted { sysctl: Option<u8> },
    /// `io_uring_setup` failed otherwise (e.g. ENOMEM under a low RLIMIT_MEMLOCK).
    Setup(std::io::Error),
    /// `IORING_REGISTER_PROBE` failed (kernel older than 5.6).
    ProbeFailed(std::io::Error),
    /// A required opcode is not supported by this kernel.
    MissingOpcode(&'static str),
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::NotImplemented => write!(
                f,
                "io_uring is not available: io_uring_setup returned ENOSYS (kernel without \
                 CONFIG_IO_URING, or a seccomp filter such as Docker's default profile blocks it)"
            ),
            ProbeError::DisabledBySysctl(v) => write!(
                f,
                "io_uring is disabled: /proc/sys/kernel/io_uring_disabled = {v} \
                 (set it to 0 to run the gateway)"
            ),
            ProbeError::NotPermitted { sysctl } => write!(
                f,
                "io_uring is not permitted: io_uring_setup returned EPERM \
                 (kernel.io_uring_disabled = {}; a seccomp filter may also block it)",
                sysctl.map_or("unknown".to_string(), |v| v.to_string())
            ),
            ProbeError::Setup(e) => write!(f, "io_uring_setup failed: {e}"),
            ProbeError::ProbeFailed(e) => write!(
                f,
                "IORING_REGISTER_PROBE failed ({e}): kernel too old, the gateway needs >= 6.12"
            ),
            ProbeError::MissingOpcode(op) => write!(
                f,
                "io_uring opcode {op} is not supported by this kernel (the gateway needs >= 6.12)"
            ),
        }
    }
}

/// What the probe found that the reactor may adapt to.
#[derive(Debug, Clone, Copy)]
pub struct Features {
    /// `IORING_OP_URING_CMD` exists (TX_TIMESTAMP socket command may work; verified per socket).
    pub uring_cmd: bool,
    /// `IORING_OP_MSG_RING` exists (Linux 5.18): how a `syncfs` completes into a core's ring
    /// (`--fsync-scope filesystem`).
    pub msg_ring: bool,
}

/// Runs the probe.
pub fn probe() -> Result<Features, ProbeError> {
    let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u8>().ok());
    if sysctl == Some(2) {
        return Err(ProbeError::DisabledBySysctl(2));
    }
    let ring = match IoUring::new(8) {
        Ok(r) => r,
        Err(e) => {
            return Err(match e.raw_os_error() {
                Some(libc::ENOSYS) => ProbeError::NotImplemented,
                Some(libc::EPERM) => ProbeError::NotPermitted { sysctl },
                _ => ProbeError::Setup(e),
            });
        }
    };
    let mut p = Probe::new();
    ring.submitter()
        .register_probe(&mut p)
        .map_err(ProbeError::ProbeFailed)?;
    let required: [(u8, &'static str); 9] = [
        (opcode::AcceptMulti::CODE, "ACCEPT"),
        (opcode::Recv::CODE, "RECV"),
        (opcode::Send::CODE, "SEND"),
        (opcode::SendMsg::CODE, "SENDMSG"),
        (opcode::PollAdd::CODE, "POLL_ADD"),
        (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
        (opcode::Read::CODE, "READ"),
        (opcode::Close::CODE, "CLOSE"),
        (opcode::Timeout::CODE, "TIMEOUT"),
    ];
    for (code, name) in required {
        if !p.is_supported(code) {
            return Err(ProbeError::MissingOpcode(name));
        }
    }
    Ok(Features {
        uring_cmd: p.is_supported(opcode::UringCmd16::CODE),
        msg_ring: p.is_supported(opcode::MsgRingData::CODE),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_has_io_uring() {
        // The gateway's test environment is documented to have io_uring (kernel 6.18).
        let f = probe().expect("io_uring available");
        assert!(f.uring_cmd && f.msg_ring);
    }

    #[test]
    fn messages_name_the_cause() {
        assert!(
            ProbeError::DisabledBySysctl(2)
                .to_string()
                .contains("io_uring_disabled = 2")
        );
        assert!(ProbeError::NotImplemented.to_string().contains("seccomp"));
        let e = ProbeError::NotPermitted { sysctl: Some(1) }.to_string();
        assert!(e.contains("EPERM") && e.contains("io_uring_disabled = 1"));
        assert!(
            ProbeError::MissingOpcode("SENDMSG")
                .to_string()
                .contains("SENDMSG")
        );
    }
}
