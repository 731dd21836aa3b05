//! Connections to one upstream: opening them (TCP, then the TLS handshake for `https://`) and
//! the keep-alive pool. The pool holds at most `pool_connections_max` idle connections, the
//! most recently used handed out first; one idle for `pool_idle` is closed (by a small reaper
//! thread, started with the first idle connection, that ends with the pool). A request never
//! waits for a connection: with none idle it opens one, and an answer read to its end puts
//! its connection back if there is room. Before an idle connection is handed out it is probed
//! without blocking: anything readable (the server's FIN, a TLS alert, stray bytes) means it
//! is not used. The retry rules for a connection that still turns out stale are in `mod.rs`.

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Connect, handshake and write timeout towards the upstream.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection's byte stream: plain TCP or TLS over it.
pub(super) enum Transport {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Transport {
    pub(super) fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(s) => &s.sock,
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Tls(s) => s.flush(),
        }
    }
}

/// One connection to the upstream and its read buffer.
pub(super) struct Conn {
    pub(super) io: BufReader<Transport>,
    /// It carried an answer before this request: it may have gone stale while idle.
    pub(super) reused: bool,
    /// Keep-alive: a complete answer puts it back into the pool.
    pub(super) pooled: bool,
    idle_since: Instant,
}

impl Conn {
    pub(super) fn tcp(&self) -> &TcpStream {
        self.io.get_ref().tcp()
    }

    /// Writes a whole request. An error means the server did not get all of it.
    pub(super) fn write_request(&mut self, req: &[u8]) -> io::Result<()> {
        let t = self.io.get_mut();
        t.write_all(req)?;
        t.flush()
    }

    /// Idle and still usable: nothing buffered, nothing readable on the socket (a FIN, an
    /// alert, stray bytes all disqualify), checked without blocking.
    fn still_open(&mut self) -> bool {
        if !self.io.buffer().is_empty() {
            return false;
        }
        if let Transport::Tls(s) = self.io.get_mut() {
            // Records rustls took in with the last answer (a close_notify right after it).
            match s.conn.process_new_packets() {
                Ok(st) if st.plaintext_bytes_to_read() == 0 && !st.peer_has_closed() => {}
                _ => return false,
            }
        }
        let tcp = self.tcp();
        if tcp.set_nonblocking(true).is_err() {
            return false;
        }
        let open =
            matches!(tcp.peek(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        tcp.set_nonblocking(false).is_ok() && open
    }

    /// Closes an idle connection: a TLS `close_notify` first (best effort, never blocking).
    fn close(mut self) {
        if let Transport::Tls(s) = self.io.get_mut() {
            s.conn.send_close_notify();
            if s.sock.set_nonblocking(true).is_ok() {
                let _ = s.conn.write_tls(&mut s.sock);
            }
        }
        let _ = self.tcp().shutdown(Shutdown::Both);
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.io.read(buf)
    }
}

impl BufRead for Conn {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.io.fill_buf()
    }

    fn consume(&mut self, n: usize) {
        self.io.consume(n);
    }
}

/// Counters of a pool (`/metrics`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Connections opened (TCP connected; for TLS, also the handshake done).
    pub connections_opened: u64,
    /// Requests sent on a connection that had carried an earlier answer.
    pub requests_reused: u64,
    /// Requests sent again on a fresh connection after a reused one turned out closed.
    pub requests_retried: u64,
    /// Idle connections now.
    pub connections_idle: u64,
}

#[derive(Default)]
struct Idle {
    conns: Vec<Conn>,
    closed: bool,
    reaper: bool,
}

/// How to reach the upstream and its idle connections.
pub(super) struct Pool {
    addr: SocketAddr,
    tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    max: usize,
    idle_timeout: Duration,
    idle: Mutex<Idle>,
    opened: AtomicU64,
    reused: AtomicU64,
    retried: AtomicU64,
}

impl Pool {
    pub(super) fn new(
        addr: SocketAddr,
        tls: Option<(Arc<ClientConfig>, ServerName<'static>)>,
        max: usize,
        idle_timeout: Duration,
    ) -> Pool {
        Pool {
            addr,
            tls,
            max,
            idle_timeout,
            idle: Mutex::new(Idle::default()),
            opened: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            retried: AtomicU64::new(0),
        }
    }

    /// Connections are kept for reuse (`--upstream-pool-connections-max` above 0).
    pub(super) fn keeps(&self) -> bool {
        self.max > 0
    }

    /// An idle connection that passes the probe (the most recently used first), if any.
    pub(super) fn take(&self) -> Option<Conn> {
        loop {
            let mut c = self.idle.lock().expect("pool lock").conns.pop()?;
            if c.idle_since.elapsed() < self.idle_timeout && c.still_open() {
                c.reused = true;
                self.reused.fetch_add(1, Ordering::Relaxed);
                return Some(c);
            }
            c.close();
        }
    }

    /// Opens a connection (`pooled`: it may go back into the pool after its answer). The error
    /// says what failed — connecting or the TLS handshake (a certificate refused, …) — and
    /// names no address (it may reach a client in a JSON-RPC error).
    pub(super) fn connect(&self, pooled: bool) -> Result<Conn, String> {
        let tcp = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT)
            .map_err(|e| format!("cannot connect to the upstream: {e}"))?;
        let _ = tcp.set_nodelay(true);
        tcp.set_write_timeout(Some(IO_TIMEOUT))
            .map_err(|e| format!("cannot connect to the upstream: {e}"))?;
        let io = match &self.tls {
            None => Transport::Plain(tcp),
            Some((cfg, name)) => Transport::Tls(Box::new(handshake(tcp, cfg, name)?)),
        };
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(Conn {
            io: BufReader::with_capacity(16 * 1024, io),
            reused: false,
            pooled: pooled && self.keeps(),
            idle_since: Instant::now(),
        })
    }

    /// A request goes again on a fresh connection (counted).
    pub(super) fn note_retry(&self) {
        self.retried.fetch_add(1, Ordering::Relaxed);
    }

    /// Back into the pool after a complete answer (closed instead when the pool is full or
    /// closed, or the connection is not a keep-alive one).
    pub(super) fn give_back(self: &Arc<Self>, mut c: Conn) {
        if !c.pooled {
            return;
        }
        c.idle_since = Instant::now();
        let mut g = self.idle.lock().expect("pool lock");
        if g.closed || g.conns.len() >= self.max {
            drop(g);
            return c.close();
        }
        g.conns.push(c);
        if !g.reaper {
            g.reaper = true;
            let weak = Arc::downgrade(self);
            let every =
                (self.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
            let started = std::thread::Builder::new()
                .name("mcp-up-pool".into())
                .spawn(move || reap_while_alive(&weak, every));
            g.reaper = started.is_ok();
        }
    }

    /// Closes the connections idle for `idle_timeout`; false once the pool is closed.
    fn reap(&self) -> bool {
        let mut old = Vec::new();
        {
            let mut g = self.idle.lock().expect("pool lock");
            if g.closed {
                return false;
            }
            let (keep, expired): (Vec<Conn>, Vec<Conn>) = std::mem::take(&mut g.conns)
                .into_iter()
                .partition(|c| c.idle_since.elapsed() < self.idle_timeout);
            g.conns = keep;
            old.extend(expired);
        }
        old.into_iter().for_each(Conn::close);
        true
    }

    /// Closes every idle connection; nothing is kept from now on.
    pub(super) fn close_all(&self) {
        let conns = {
            let mut g = self.idle.lock().expect("pool lock");
            g.closed = true;
            std::mem::take(&mut g.conns)
        };
        conns.into_iter().for_each(Conn::close);
    }

    pub(super) fn stats(&self) -> PoolStats {
        PoolStats {
            connections_opened: self.opened.load(Ordering::Relaxed),
            requests_reused: self.reused.load(Ordering::Relaxed),
            requests_retried: self.retried.load(Ordering::Relaxed),
            connections_idle: self.idle.lock().expect("pool lock").conns.len() as u64,
        }
    }
}

/// The reaper thread: runs until the pool is closed or dropped.
fn reap_while_alive(pool: &Weak<Pool>, every: Duration) {
    loop {
        std::thread::sleep(every);
        match pool.upgrade() {
            Some(p) if p.reap() => {}
            _ => return,
        }
    }
}

/// The TLS handshake, done before anything is written so that a refused certificate is a
/// failed connection, never a request sent in plaintext or to the wrong server.
fn handshake(
    tcp: TcpStream,
    cfg: &Arc<ClientConfig>,
    name: &ServerName<'static>,
) -> Result<StreamOwned<ClientConnection, TcpStream>, String> {
    let fail = |e: &dyn std::fmt::Display| format!("TLS handshake with the upstream failed: {e}");
    let conn = ClientConnection::new(cfg.clone(), name.clone()).map_err(|e| fail(&e))?;
    let mut s = StreamOwned::new(conn, tcp);
    s.sock
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| fail(&e))?;
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).map_err(|e| fail(&e))?;
    }
    s.sock.set_read_timeout(None).map_err(|e| fail(&e))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pool(max: usize) -> (Arc<Pool>, TcpListener) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = Pool::new(l.local_addr().unwrap(), None, max, Duration::from_secs(30));
        (Arc::new(p), l)
    }

    /// Idle connections are handed out most recent first, at most `max` are kept, and one the
    /// server has closed is never handed out (the probe sees its FIN).
    #[test]
    fn idle_connections_are_bounded_and_probed() {
        let (p, l) = pool(2);
        let conns: Vec<Conn> = (0..3).map(|_| p.connect(true).unwrap()).collect();
        let mut peers: Vec<TcpStream> = (0..3).map(|_| l.accept().unwrap().0).collect();
        let ports: Vec<u16> = conns
            .iter()
            .map(|c| c.tcp().local_addr().unwrap().port())
            .collect();
        for c in conns {
            p.give_back(c);
        }
        assert_eq!(p.stats().connections_idle, 2, "the third is closed");
        let mut third = [0u8; 1];
        assert_eq!(peers[2].read(&mut third).unwrap(), 0, "closed by the pool");
        // The server closes the most recent idle one: the probe skips it.
        drop(peers.remove(1));
        std::thread::sleep(Duration::from_millis(50));
        let c = p.take().expect("the other one is still open");
        assert_eq!(c.tcp().local_addr().unwrap().port(), ports[0]);
        assert!(c.reused);
        assert!(p.take().is_none());
        let st = p.stats();
        assert_eq!((st.connections_opened, st.requests_reused), (3, 1));
    }

    /// Stray bytes on an idle connection (no request was sent) disqualify it; with 0 kept
    /// connections nothing is pooled; a closed pool keeps nothing.
    #[test]
    fn stray_bytes_zero_max_and_closed_pool() {
        let (p, l) = pool(4);
        let c = p.connect(true).unwrap();
        let mut peer = l.accept().unwrap().0;
        p.give_back(c);
        peer.write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(p.take().is_none());
        let (none, _l) = pool(0);
        let c = none.connect(true).unwrap();
        assert!(!c.pooled && !none.keeps());
        none.give_back(c);
        assert_eq!(none.stats().connections_idle, 0);
        p.close_all();
        p.give_back(p.connect(true).unwrap());
        assert_eq!(p.stats().connections_idle, 0);
    }
}
