//! The core's timers (every tick): the accept re-arm after an error and every connection's
//! timers (`net/tick.rs`), then closing, flushing and pumping what they name, parked-window
//! expiry, retention, the metrics snapshot; and shutdown.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, SystemTime};

use super::net::tick::Gauges;
use super::{Core, State};
use crate::config::Config;
use crate::metrics::CoreMetrics;
use crate::proto::access::Gate;
use crate::streams::hub::Hub;
use crate::uring::{Op, UnmatchedCounts};

/// A tick's gauges: the sums over the connections and the driver's unmatched completions.
fn store_tick_gauges(m: &CoreMetrics, g: &Gauges, u: UnmatchedCounts) {
    crate::metrics::bump_own(&m.ticks, 1);
    m.inflight_bytes.store(g.inflight_bytes, Relaxed);
    m.answer_bytes_queued.store(g.answers, Relaxed);
    m.lag_events_max.store(g.lag_max, Relaxed);
    m.unmatched_completions_total
        .store(u.repeat + u.unknown, Relaxed);
    m.cq_stale_slots_total.store(u.stale_slot, Relaxed);
}

/// The gate's refusals so far (this core's token cache and CORS checks).
fn store_gate_counts(m: &CoreMetrics, gate: &Gate) {
    m.auth_refusals_total.store(gate.auth_refusals, Relaxed);
    m.origin_refusals_total.store(gate.origin_refusals, Relaxed);
}

/// The streams' gauge and, under `--metrics-per-stream`, their lines (at the retention tick).
fn store_stream_gauges(m: &CoreMetrics, hub: &Hub, cfg: &Config) {
    let lines = if cfg.metrics_per_stream {
        hub.stream_lines(cfg.metrics_per_stream_max)
    } else {
        String::new()
    };
    *m.streams_snapshot.lock().expect("metrics lock") = lines;
    m.streams.store(hub.stream_count() as u64, Relaxed);
    let r = hub.roll_counts();
    m.log_rolls_prepared_total.store(r.prepared, Relaxed);
    m.log_rolls_inline_total.store(r.inline, Relaxed);
    m.log_rolls_flushed_total.store(r.flushed, Relaxed);
}

impl Core {
    pub(super) fn tick(&mut self) {
        let now = self.now;
        self.net.rearm_paused_accept();
        let (mut to_close, mut to_flush, mut to_pump, g) =
            self.net
                .tick_connections(&self.hub, &self.lim, self.gate.now_unix_secs);
        store_tick_gauges(self.m(), &g, self.net.io.unmatched());
        while let Some(slot) = self.net.next_open(&mut to_flush) {
            self.net.flush(slot);
        }
        while let Some(slot) = self.net.next_open(&mut to_close) {
            self.close_conn(slot); // may close later ones: `next_open` skips them
        }
        while let Some(slot) = self.net.next_open(&mut to_pump) {
            self.pump(slot);
        }
        self.retry_deferred_recvs();
        self.cluster_tick();
        store_gate_counts(self.m(), &self.gate);
        self.subs.expire(&self.shared.metrics[self.id], now);
        if now >= self.next_retention {
            self.next_retention = now + Duration::from_secs(1);
            crate::sys::allocator_collect(); // freed set-up buffers back, once a second
            self.hub.enforce_retention(SystemTime::now(), self.id);
            if self.cluster.is_none() {
                // A removal would be one node's alone (cluster mode removes no stream).
                self.expire_idle_streams();
            }
            store_stream_gauges(self.m(), &self.hub, &self.shared.cfg);
        }
        if self.shared.shutdown.load(Relaxed) && self.shutting_down.is_none() {
            self.begin_shutdown();
        }
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
        self.waits.complete(&mut self.net, &self.hub);
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
