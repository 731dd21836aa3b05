//! Thin, checked wrappers over the few Linux syscalls the gateway makes outside io_uring:
//! listener sockets (SO_REUSEPORT), socket options (TCP_NODELAY, TCP_NOTSENT_LOWAT,
//! SO_TIMESTAMPING), SIOCOUTQ, eventfd, CPU pinning, signal masks, shutdown/close. Each
//! `unsafe` block is a single libc call on plain values or on memory owned by the caller for
//! the duration of the call. Nothing here knows about HTTP or the log.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `v` lives on the stack for the duration of the call and its size is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const v).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Creates a listening IPv4/IPv6 TCP socket with SO_REUSEPORT (so each core binds its own).
pub fn listener(addr: SocketAddr, backlog: i32) -> io::Result<RawFd> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall with constant arguments.
    let fd = cvt(unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    let res = (|| {
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
        let (storage, len) = sockaddr(addr);
        // SAFETY: `storage` is a valid sockaddr of `len` bytes living across the call.
        cvt(unsafe { libc::bind(fd, (&raw const storage).cast(), len) })?;
        // SAFETY: plain syscall on an fd we own.
        cvt(unsafe { libc::listen(fd, backlog) })?;
        Ok(())
    })();
    match res {
        Ok(()) => Ok(fd),
        Err(e) => {
            close(fd);
            Err(e)
        }
    }
}

/// Like [`listener`], for the first of the process's listeners: fails with `AddrInUse` when
/// another socket already listens on `addr`. SO_REUSEPORT alone would let a second gateway
/// process (same user) join the port silently, and the kernel would then split connections
/// between two logs with different epochs: resumes answered `wrong_epoch`, counters read
/// from either process. A probe socket without SO_REUSEPORT sees the existing listener.
pub fn listener_first(addr: SocketAddr, backlog: i32) -> io::Result<RawFd> {
    if addr.port() != 0 {
        let family = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain syscall with constant arguments.
        let probe =
            cvt(unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
        let res = (|| {
            // SO_REUSEADDR only: TIME_WAIT leftovers of an earlier run are no conflict.
            setsockopt_int(probe, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
            let (storage, len) = sockaddr(addr);
            // SAFETY: `storage` is a valid sockaddr of `len` bytes living across the call.
            cvt(unsafe { libc::bind(probe, (&raw const storage).cast(), len) })
        })();
        close(probe);
        if let Err(e) = res {
            if e.kind() == io::ErrorKind::AddrInUse {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "another process already listens on {addr} (SO_REUSEPORT would \
                         share the port with it and split the streams between two logs)"
                    ),
                ));
            }
            return Err(e);
        }
    }
    listener(addr, backlog)
}

/// The address a socket is bound to.
pub fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `storage`/`len` are valid for writes of the passed size.
    cvt(unsafe { libc::getsockname(fd, (&raw mut storage).cast(), &mut len) })?;
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family AF_INET) into the storage.
            let a: libc::sockaddr_in = unsafe { *(&raw const storage).cast() };
            Ok(SocketAddr::from((
                u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (family AF_INET6) into the storage.
            let a: libc::sockaddr_in6 = unsafe { *(&raw const storage).cast() };
            Ok(SocketAddr::from((
                a.sin6_addr.s6_addr,
                u16::from_be(a.sin6_port),
            )))
        }
        _ => Err(io::Error::other("unknown address family")),
    }
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_be_bytes(a.ip().octets()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in>().write(sin) };
            (storage, size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in6>().write(sin6) };
            (storage, size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

/// TCP_NODELAY on: responses and batched event sends go out at once.
pub fn set_nodelay(fd: RawFd) -> io::Result<()> {
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
}

/// TCP_NOTSENT_LOWAT: the socket reports writable only while unsent bytes are below `bytes`.
pub fn set_notsent_lowat(fd: RawFd, bytes: u32) -> io::Result<()> {
    setsockopt_int(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_NOTSENT_LOWAT,
        bytes.min(i32::MAX as u32) as libc::c_int,
    )
}

/// `SO_TIMESTAMPING` (asm-generic value; `libc` exposes only the flag constants).
const SO_TIMESTAMPING: libc::c_int = 37;

/// Prepares TX ACK timestamps keyed by TCP byte offset (counted from the next byte written).
/// No send asks for one yet: a sendmsg carrying [`tx_ack_cmsg`] does (the socket holds the
/// key and reporting options; the per-message control adds the ACK record flag).
pub fn enable_tx_ack_timestamps(fd: RawFd) -> io::Result<()> {
    let flags = libc::SOF_TIMESTAMPING_SOFTWARE
        | libc::SOF_TIMESTAMPING_OPT_ID
        | libc::SOF_TIMESTAMPING_OPT_ID_TCP
        | libc::SOF_TIMESTAMPING_OPT_TSONLY;
    setsockopt_int(fd, libc::SOL_SOCKET, SO_TIMESTAMPING, flags as libc::c_int)
}

/// One `SOL_SOCKET/SO_TIMESTAMPING` control message carrying a `u32` of flags, laid out as
/// `CMSG_SPACE(4)` bytes (the header is already `CMSG_ALIGN`ed on Linux; checked in a test).
#[repr(C)]
struct TsCmsg {
    hdr: libc::cmsghdr,
    flags: u32,
}

static TX_ACK_CMSG: TsCmsg = TsCmsg {
    hdr: libc::cmsghdr {
        cmsg_len: std::mem::size_of::<libc::cmsghdr>() + std::mem::size_of::<u32>(),
        cmsg_level: libc::SOL_SOCKET,
        cmsg_type: SO_TIMESTAMPING,
    },
    flags: libc::SOF_TIMESTAMPING_TX_ACK,
};

/// The control message that makes one sendmsg ask for a TX ACK timestamp of its last byte,
/// as `(msg_control, msg_controllen)`. A static: the kernel only reads it, and a send in flight
/// may point at it at any time.
pub fn tx_ack_cmsg() -> (*mut libc::c_void, usize) {
    (
        std::ptr::from_ref(&TX_ACK_CMSG).cast_mut().cast(),
        std::mem::size_of::<TsCmsg>(),
    )
}

/// SIOCOUTQ: bytes in the socket's send queue not yet acknowledged by the peer (unsent + unacked).
pub fn outq_bytes(fd: RawFd) -> io::Result<u64> {
    let mut v: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (== SIOCOUTQ) writes one c_int to the pointer, which is valid.
    cvt(unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut v) })?;
    Ok(v.max(0) as u64)
}

/// What [`discard_input`] found on a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Nothing (more) to read now; the peer is still there.
    Open,
    /// End of stream or a socket error: the peer is gone.
    Gone,
}

/// Reads and drops whatever a peer sent, without blocking (bounded: 64 reads of 4 KiB; more
/// is left for the next poll wake-up).
pub fn discard_input(fd: RawFd) -> Input {
    let mut buf = [0u8; 4096];
    for _ in 0..64 {
        // SAFETY: `buf` is valid for writes of its length during the call.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        match n {
            0 => return Input::Gone,
            n if n > 0 => continue,
            _ => {
                let e = io::Error::last_os_error().raw_os_error();
                return match e {
                    Some(libc::EAGAIN | libc::EINTR) => Input::Open,
                    _ => Input::Gone,
                };
            }
        }
    }
    Input::Open
}

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> io::Result<RawFd> {
    // SAFETY: plain syscall with constant arguments.
    cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })
}

/// Adds 1 to an eventfd (wakes the ring that has a read armed on it).
pub fn eventfd_wake(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a stack value that outlives the call. A full counter
    // (EAGAIN) already means "wake", so the result is deliberately ignored.
    let _ = unsafe { libc::write(fd, (&raw const one).cast(), 8) };
}

/// Best-effort immediate send of a small response on a fresh socket (used to refuse a
/// connection above --connections-max without allocating any per-connection state).
pub fn send_now(fd: RawFd, bytes: &[u8]) {
    // SAFETY: `bytes` is valid for reads of its length during the call.
    let _ = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT) };
}

/// shutdown(SHUT_RDWR): queued data is still sent, then FIN; wakes pending recv/poll.
pub fn shutdown(fd: RawFd) {
    // SAFETY: plain syscall on an fd we own; errors (ENOTCONN) are irrelevant here.
    let _ = unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// close(2), ignoring errors (the fd is gone either way on Linux).
pub fn close(fd: RawFd) {
    // SAFETY: the caller owns `fd` and no io_uring operation still refers to it by number
    // (the kernel keeps its own file reference for in-flight operations anyway).
    let _ = unsafe { libc::close(fd) };
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit inside `set`; `cpu` < CPU_SETSIZE is checked by libc.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the passed size; pid 0 = calling thread.
    cvt(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) }).map(drop)
}

/// CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is valid for writes of the passed size.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads one bit of the initialized `set`; c < CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Raises the soft RLIMIT_NOFILE towards `want` (capped by the hard limit); returns the
/// resulting soft limit.
pub fn raise_nofile(want: u64) -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is valid for writes of one rlimit.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    if lim.rlim_cur < want {
        lim.rlim_cur = want.min(lim.rlim_max);
        // SAFETY: `lim` is an initialized rlimit read by the call.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    }
    Ok(lim.rlim_cur)
}

/// Blocks SIGINT and SIGTERM in the calling thread (inherited by threads it spawns) and
/// returns the set, for [`wait_signal`].
pub fn block_shutdown_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initializes it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t for the call to write.
    unsafe { libc::sigemptyset(&mut set) };
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `set` is an initialized sigset_t; `sig` is a valid signal number.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    // SAFETY: `set` is initialized; a null old-mask pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    set
}

/// Waits for one of the blocked signals; returns its number.
pub fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is an initialized sigset_t, `sig` is valid for writes.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

#[cfg(test)]
mod tests {
    #[test]
    fn tx_ack_cmsg_has_the_kernel_layout() {
        let (ptr, len) = super::tx_ack_cmsg();
        // SAFETY: CMSG_SPACE is arithmetic on its argument.
        let space = unsafe { libc::CMSG_SPACE(4) } as usize;
        // SAFETY: as CMSG_SPACE.
        let clen = unsafe { libc::CMSG_LEN(4) } as usize;
        assert_eq!(len, space);
        // SAFETY: an all-zero msghdr is valid; only its control fields are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_control = ptr;
        msg.msg_controllen = len;
        // SAFETY: `msg` names the static control buffer of `len` bytes, which holds one header:
        // CMSG_FIRSTHDR returns its start.
        let first = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        // SAFETY: `first` points at the static, initialised header.
        let c = unsafe { &*first };
        assert_eq!(
            (c.cmsg_len, c.cmsg_level, c.cmsg_type),
            (clen, libc::SOL_SOCKET, super::SO_TIMESTAMPING)
        );
        // SAFETY: CMSG_DATA addresses the u32 inside the same header.
        let data = unsafe { libc::CMSG_DATA(c) };
        // SAFETY: `data` points at the static's `flags` field (4 readable bytes).
        let flags = unsafe { data.cast::<u32>().read_unaligned() };
        assert_eq!(flags, libc::SOF_TIMESTAMPING_TX_ACK);
    }
}
