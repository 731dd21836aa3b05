//! The few Linux calls the gateway makes outside io_uring: listener sockets (SO_REUSEPORT),
//! socket options (TCP_NODELAY, TCP_NOTSENT_LOWAT, SO_TIMESTAMPING, TCP_ULP and kernel TLS'
//! keys), TCP_INFO, SIOCOUTQ, eventfd, CPU pinning, the descriptor limit, signal masks,
//! shutdown. Through `rustix` (safe, on owned and borrowed descriptors) wherever it has the
//! call; the rest — the socket options rustix does not name, TCP_INFO, the SIOCOUTQ ioctl and
//! the signal-mask calls — are single libc calls on plain values or on memory owned by the
//! caller for the duration of the call, each with its proof. Nothing here knows about HTTP or
//! the log.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use rustix::net::{self as rnet, AddressFamily, SocketFlags, SocketType, sockopt};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An int socket option rustix does not name.
fn setsockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    setsockopt_bytes(fd, level, name, &v.to_ne_bytes())
}

fn tcp_socket(addr: SocketAddr) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    Ok(rnet::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Creates a listening IPv4/IPv6 TCP socket with SO_REUSEPORT (so each core binds its own).
pub fn listener(addr: SocketAddr, backlog: i32) -> io::Result<OwnedFd> {
    let fd = tcp_socket(addr)?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    sockopt::set_socket_reuseport(&fd, true)?;
    rnet::bind(&fd, &addr)?;
    rnet::listen(&fd, backlog)?;
    Ok(fd)
}

/// Like [`listener`], for the first of the process's listeners: fails with `AddrInUse` when
/// another socket already listens on `addr`. SO_REUSEPORT alone would let a second gateway
/// process (same user) join the port silently, and the kernel would then split connections
/// between two logs with different epochs: resumes answered `wrong_epoch`, counters read
/// from either process. A probe socket without SO_REUSEPORT sees the existing listener.
pub fn listener_first(addr: SocketAddr, backlog: i32) -> io::Result<OwnedFd> {
    if addr.port() != 0 {
        let probe = tcp_socket(addr)?;
        // SO_REUSEADDR only: TIME_WAIT leftovers of an earlier run are no conflict.
        sockopt::set_socket_reuseaddr(&probe, true)?;
        match rnet::bind(&probe, &addr) {
            Ok(()) => {} // dropping the probe closes it: the port is free for the listeners
            Err(rustix::io::Errno::ADDRINUSE) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "another process already listens on {addr} (SO_REUSEPORT would \
                         share the port with it and split the streams between two logs)"
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    listener(addr, backlog)
}

/// The address a socket is bound to.
pub fn local_addr(fd: BorrowedFd<'_>) -> io::Result<SocketAddr> {
    let any = rnet::getsockname(fd)?;
    SocketAddr::try_from(any).map_err(|_| io::Error::other("unknown address family"))
}

/// The peer's IP address of a connected socket (an IPv4-mapped IPv6 address as IPv4, so one
/// client counts once whichever family the listener has).
pub fn peer_ip(fd: BorrowedFd<'_>) -> io::Result<std::net::IpAddr> {
    let any = rnet::getpeername(fd)?.ok_or_else(|| io::Error::other("no peer address"))?;
    let addr = SocketAddr::try_from(any).map_err(|_| io::Error::other("unknown address family"))?;
    Ok(addr.ip().to_canonical())
}

/// TCP_NODELAY on: responses and batched event sends go out at once.
pub fn set_nodelay(fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(sockopt::set_tcp_nodelay(fd, true)?)
}

/// TCP_NOTSENT_LOWAT: the socket reports writable only while unsent bytes are below `bytes`.
pub fn set_notsent_lowat(fd: BorrowedFd<'_>, bytes: u32) -> io::Result<()> {
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
pub fn enable_tx_ack_timestamps(fd: BorrowedFd<'_>) -> io::Result<()> {
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
pub fn outq_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (== SIOCOUTQ) writes one c_int to the pointer, which is valid; `fd` is
    // borrowed for the call.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut v) })?;
    Ok(v.max(0) as u64)
}

/// `TCP_INFO`'s `tcpi_bytes_acked`: bytes of this connection the peer has ACKed.
pub fn tcp_bytes_acked(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: tcp_info is plain data (all-zero valid).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes to `info`, which lives on the stack for the
    // call; `fd` is borrowed for the call.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    })?;
    let end = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + size_of::<u64>();
    if (len as usize) < end {
        return Err(io::Error::other("TCP_INFO has no tcpi_bytes_acked"));
    }
    Ok(info.tcpi_bytes_acked)
}

/// `TCP_ULP` (`"tls"`: kernel TLS, which may load its module on demand; ENOENT when the
/// kernel has none).
pub fn set_tcp_ulp(fd: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    setsockopt_bytes(fd, libc::IPPROTO_TCP, libc::TCP_ULP, name.as_bytes())
}

/// A socket option whose value is a byte string or a C struct laid out as bytes (kernel TLS'
/// `struct tls12_crypto_info_*`, built and layout-checked in `tls/kernel.rs`).
pub fn setsockopt_bytes(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    v: &[u8],
) -> io::Result<()> {
    // SAFETY: the kernel reads `v.len()` bytes from `v`, borrowed for the call; `fd` likewise.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            v.as_ptr().cast(),
            v.len() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Reads a socket option into `buf`; returns the length the kernel wrote.
pub fn getsockopt_bytes(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    buf: &mut [u8],
) -> io::Result<usize> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` (= `buf.len()`) bytes to `buf`, borrowed
    // mutably for the call; `fd` is borrowed for the call.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    })?;
    Ok(len as usize)
}

/// Whether every page under `bytes` — a slice of a file mapping — is in memory (`mincore(2)`).
/// `true` when it cannot tell (then nothing is read ahead).
pub fn resident(bytes: &[u8]) -> bool {
    if bytes.is_empty() {
        return true;
    }
    let page = rustix::param::page_size();
    let start = bytes.as_ptr() as usize & !(page - 1);
    let end = bytes.as_ptr() as usize + bytes.len();
    let pages = (end - start).div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only reads the page tables of `[start, start + pages * page)` (rounded
    // out to pages from memory the caller holds mapped) and writes one byte per page into
    // `vec`, which has `pages` bytes.
    let r = unsafe { libc::mincore(start as *mut libc::c_void, pages * page, vec.as_mut_ptr()) };
    r != 0 || vec.iter().all(|&b| b & 1 == 1)
}

/// Asks the kernel to drop the pages under `bytes` from memory (`MADV_PAGEOUT`), so tests can
/// make a mapping cold. Page-rounded like [`resident`].
#[cfg(test)]
pub fn page_out(bytes: &[u8]) -> io::Result<()> {
    let page = rustix::param::page_size();
    let start = bytes.as_ptr() as usize & !(page - 1);
    let end = (bytes.as_ptr() as usize + bytes.len()).div_ceil(page) * page;
    // SAFETY: MADV_PAGEOUT only reclaims pages of the caller's mapping (file-backed pages are
    // read back on the next access); it never unmaps or changes their content.
    cvt(unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT) })
        .map(drop)
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
pub fn discard_input(fd: BorrowedFd<'_>) -> Input {
    let mut buf = [0u8; 4096];
    for _ in 0..64 {
        match rnet::recv(fd, &mut buf, rnet::RecvFlags::DONTWAIT) {
            Ok((0, _)) => return Input::Gone,
            Ok(_) => continue,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return Input::Open,
            Err(_) => return Input::Gone,
        }
    }
    Input::Open
}

/// Makes the calling thread a background one (`SCHED_IDLE`): it runs only when its CPU has
/// nothing else runnable, so it never preempts a reactor sharing that CPU (sched(7): "for
/// running very low priority background jobs"). Under a saturated CPU it may not run at all
/// for a while: only for work that may lag or be dropped, or that a reactor waits for only
/// while it sleeps (its CPU idle then).
///
/// Its I/O stays best-effort: a thread without an I/O priority of its own takes one from its
/// CPU policy, and `SCHED_IDLE` maps to the idle I/O class (the kernel's `task_nice_ioclass`),
/// which mq-deadline and BFQ serve only when nothing else is queued: behind a steady stream of
/// group commits its writes could wait for seconds.
pub fn become_background_thread() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 names the calling thread; `param` is a plain value read during the call.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // ioprio_set(2): IOPRIO_WHO_PROCESS with who 0 is the calling thread.
    // SAFETY: plain integers; no memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            IOPRIO_BEST_EFFORT_DEFAULT,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// ioprio_set(2)'s `which` for a thread.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;
/// `IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, 4)`: best effort (class 2, in the top 3 bits of 16) at
/// the default level 4, what a thread of the normal policy gets.
const IOPRIO_BEST_EFFORT_DEFAULT: libc::c_int = (2 << 13) | 4;

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> io::Result<OwnedFd> {
    use rustix::event::EventfdFlags;
    Ok(rustix::event::eventfd(
        0,
        EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC,
    )?)
}

/// Adds 1 to an eventfd (wakes the ring that has a read armed on it). A full counter
/// (EAGAIN) already means "wake", so the result is deliberately ignored.
pub fn eventfd_wake(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Best-effort immediate send of a small response on a fresh socket (used to refuse a
/// connection above --connections-max without allocating any per-connection state).
pub fn send_now(fd: BorrowedFd<'_>, bytes: &[u8]) {
    let _ = rnet::send(fd, bytes, rnet::SendFlags::DONTWAIT);
}

/// What the peer has sent already, up to `max` bytes, read without waiting (nothing yet, the
/// end of input or an error: empty, and the connection's first receive finds out).
pub fn recv_now(fd: BorrowedFd<'_>, max: usize) -> Vec<u8> {
    let mut buf = vec![0u8; max];
    match rnet::recv(fd, &mut buf[..], rnet::RecvFlags::DONTWAIT) {
        Ok((n, _)) => buf.truncate(n),
        Err(_) => buf.clear(),
    }
    buf
}

/// shutdown(SHUT_RDWR): queued data is still sent, then FIN; wakes pending recv/poll. Errors
/// (ENOTCONN) are irrelevant here.
pub fn shutdown(fd: BorrowedFd<'_>) {
    let _ = rnet::shutdown(fd, rnet::Shutdown::Both);
}

/// Pins the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    Ok(rustix::thread::sched_setaffinity(None, &set)?)
}

/// CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .collect(),
        Err(_) => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

/// Raises the soft RLIMIT_NOFILE towards `want` (capped by the hard limit); returns the
/// resulting soft limit.
pub fn raise_nofile(want: u64) -> io::Result<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    let cur = lim.current.unwrap_or(u64::MAX);
    if cur >= want {
        return Ok(cur);
    }
    let new = lim.maximum.map_or(want, |max| want.min(max));
    lim.current = Some(new);
    setrlimit(Resource::Nofile, lim)?;
    Ok(new)
}

/// Blocks SIGINT and SIGTERM in the calling thread (inherited by threads it spawns) and
/// returns the set, for [`wait_signal`].
pub fn block_shutdown_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initializes it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t for the call to write.
    unsafe { libc::sigemptyset(&mut set) };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
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

/// Runs the allocator's deferred work for the calling thread now: mimalloc returns the pages
/// freed since (`mi_collect(false)`: the delayed purges of free spans). mimalloc purges
/// lazily, on the thread's next allocations; a reactor that went quiet after a burst (thousands
/// of connections set up, then held idle) would otherwise keep the burst's freed buffers
/// resident. Harmless where mimalloc is not the global allocator (tests): its heap is empty.
pub fn allocator_collect() {
    // SAFETY: `mi_collect` takes a plain bool and touches only mimalloc's own state (the
    // calling thread's heap and the shared segment cache); no memory of ours is passed.
    unsafe { libmimalloc_sys::mi_collect(false) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_background_thread_runs_under_sched_idle() {
        let policy = std::thread::spawn(|| {
            super::become_background_thread().unwrap();
            // SAFETY: pid 0 names the calling thread; no memory is passed.
            let policy = unsafe { libc::sched_getscheduler(0) };
            // SAFETY: plain integers, as above.
            let io = unsafe { libc::syscall(libc::SYS_ioprio_get, super::IOPRIO_WHO_PROCESS, 0) };
            (policy, io)
        })
        .join()
        .unwrap();
        assert_eq!(policy.0, libc::SCHED_IDLE);
        assert_eq!(
            policy.1,
            super::IOPRIO_BEST_EFFORT_DEFAULT as libc::c_long,
            "best-effort I/O"
        );
        // SAFETY: as above; this thread was not changed.
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
    }

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
