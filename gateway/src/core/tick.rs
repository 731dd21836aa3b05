//! The core's timers (every tick): the accept re-arm after an error, HTTP header and idle
//! deadlines, subscribers' `SIOCOUTQ` confirmation and keep-alives, parked-window expiry,
//! retention, the metrics snapshot; and shutdown.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime};

use super::counts::count_confirmed;
use super::net::transport::outq_plain;
use super::{Core, State};
use crate::metrics::CoreMetrics;
use crate::proto::conn::Deadline;
use crate::uring::Op;

/// Gauges summed over a core's connections at a tick.
#[derive(Debug, Default)]
struct Gauges {
    inflight_bytes: u64,
    lag_max: u64,
    answers: u64,
}

/// Counts a 408 a connection's deadline queued; returns the deadline.
fn count_deadline(m: &CoreMetrics, d: Deadline) -> Deadline {
    match d {
        Deadline::TimedOut => m.head_timeouts_total.fetch_add(1, Relaxed),
        Deadline::BodyTimedOut => m.body_timeouts_total.fetch_add(1, Relaxed),
        Deadline::None | Deadline::Idle => 0,
    };
    d
}

impl Core {
    pub(super) fn tick(&mut self) {
        let now = self.now;
        self.net.rearm_paused_accept();
        let (to_close, to_flush, to_pump, g) = self.tick_connections(now);
        let m = &self.shared.metrics[self.id];
        crate::metrics::bump_own(&m.ticks, 1);
        m.inflight_bytes.store(g.inflight_bytes, Relaxed);
        m.answer_bytes_queued.store(g.answers, Relaxed);
        m.lag_events_max.store(g.lag_max, Relaxed);
        let u = self.net.io.unmatched();
        m.unmatched_completions_total
            .store(u.repeat + u.unknown, Relaxed);
        m.cq_stale_slots_total.store(u.stale_slot, Relaxed);
        for slot in to_flush {
            self.net.flush(slot);
        }
        for slot in to_close {
            self.close_conn(slot);
        }
        for slot in to_pump {
            self.pump(slot);
        }
        self.retry_deferred_recvs();
        self.cluster_tick();
        let m = &self.shared.metrics[self.id];
        m.auth_refusals_total
            .store(self.gate.auth_refusals, Relaxed);
        m.origin_refusals_total
            .store(self.gate.origin_refusals, Relaxed);
        self.parked.expire(now);
        self.m()
            .parked_windows
            .store(self.parked.count() as u64, Relaxed);
        if now >= self.next_retention {
            self.next_retention = now + Duration::from_secs(1);
            self.hub.enforce_retention(SystemTime::now(), self.id);
            if self.cluster.is_none() {
                // A removal would be one node's alone (cluster mode removes no stream).
                self.expire_idle_streams();
            }
            let cfg = &self.shared.cfg;
            let lines = if cfg.metrics_per_stream {
                self.hub.stream_lines(cfg.metrics_per_stream_max)
            } else {
                String::new()
            };
            *self.m().streams_snapshot.lock().expect("metrics lock") = lines;
            let n = self.hub.stream_count() as u64;
            self.m().streams.store(n, Relaxed);
        }
        if self.shared.shutdown.load(Relaxed) && self.shutting_down.is_none() {
            self.begin_shutdown();
        }
    }

    /// Every connection's deadlines and confirmations: the slots to close, to flush (a 408
    /// queued) and to pump, and the gauges.
    fn tick_connections(&mut self, now: Instant) -> (Vec<u32>, Vec<u32>, Vec<u32>, Gauges) {
        let (mut to_close, mut to_flush, mut to_pump) = (Vec::new(), Vec::new(), Vec::new());
        let mut g = Gauges::default();
        let m = &self.shared.metrics[self.id];
        for (slot, conn) in self.net.conns.iter_mut() {
            if conn.closing {
                continue;
            }
            if conn
                .transport
                .handshake_overdue(now, self.lim.tls_handshake)
            {
                m.tls_handshake_failures_total.fetch_add(1, Relaxed);
                to_close.push(slot);
                continue;
            }
            match &mut conn.state {
                State::Http(h) => {
                    g.answers += h.answer_bytes() as u64;
                    match count_deadline(m, h.on_tick(now, &self.lim.conn)) {
                        Deadline::None => {}
                        Deadline::TimedOut | Deadline::BodyTimedOut => to_flush.push(slot),
                        Deadline::Idle => to_close.push(slot),
                    }
                }
                State::Sub(sub) => {
                    if sub.expire(self.gate.now_unix_secs) {
                        m.token_expired_closes_total.fetch_add(1, Relaxed);
                    }
                    if sub.wants_outq_poll(now)
                        && let Some(q) = outq_plain(
                            conn.fd.as_fd(),
                            &mut conn.transport,
                            self.net.io.in_flight(slot, Op::Send),
                        )
                    {
                        count_confirmed(m, sub.confirm_outq(q));
                    }
                    g.inflight_bytes += sub.unconfirmed_bytes();
                    if let Some(b) = self.hub.log(sub.key.0).bounds(sub.key.1) {
                        g.lag_max = g.lag_max.max(sub.lag(b.tail));
                    }
                    if !self.net.io.in_flight(slot, Op::Send)
                        && !self.net.io.in_flight(slot, Op::PollOut)
                    {
                        sub.keepalive(now, &self.lim.sub);
                    }
                    to_pump.push(slot);
                }
            }
        }
        (to_close, to_flush, to_pump, g)
    }

    /// Stop accepting, make everything durable, answer waiting publishes, close the rest.
    pub(super) fn begin_shutdown(&mut self) {
        if self.shutting_down.is_some() {
            return;
        }
        self.shutting_down = Some(self.now + Duration::from_secs(3));
        self.net.shutting_down = true;
        self.mcp_shutdown();
        self.net.stop_listening();
        self.hub.sync_all(self.id);
        self.complete_waits();
        for i in self.net.conns.slots() {
            let Some(conn) = self.net.conns.get(i) else {
                continue;
            };
            match &mut conn.state {
                State::Http(h) if self.net.io.in_flight(i, Op::Send) => h.close_after_send(),
                _ if !conn.closing => self.close_conn(i),
                _ => {}
            }
        }
    }
}
