//! Requests that ended: counted by route class and status, publish latencies observed, and
//! each handed to the access log (`access_log.rs`), never formatted here. Free functions over
//! one connection and the shared state, so the core only says when.

use std::time::Instant;

use super::Shared;
use super::conns::{Conn, State};
use super::counts::count_sent;
use crate::access_log;
use crate::metrics::{self, CoreMetrics, bump_own};
use crate::proto::request_log::{Finished, Record, RouteClass};
use crate::streams::sub::Sent;
use log_store::ResumeClass;

/// Every request whose final answer left `conn`'s outbox.
pub(super) fn answered(shared: &Shared, core: usize, now: Instant, conn: &mut Conn) {
    let peer = conn.peer;
    if let State::Http(h) = &mut conn.state {
        h.drain_finished(|f| finish(shared, core, now, peer, f));
    }
}

/// A subscription ended: its line (status 200, the bytes it sent, its resume class).
pub(super) fn subscription_ended(shared: &Shared, core: usize, now: Instant, conn: &mut Conn) {
    if let (Some(record), State::Sub(sub)) = (conn.record.take(), &conn.state) {
        let f = Finished {
            record: *record,
            status: 200,
            bytes_out: sub.bytes_sent(),
        };
        finish(shared, core, now, conn.peer, f);
    }
}

/// A subscribe's resume class (if it resumed) is counted and goes on its line.
pub(super) fn resumed(m: &CoreMetrics, conn: &mut Conn, class: Option<ResumeClass>) {
    if let (Some(class), State::Http(h)) = (class, &mut conn.state) {
        m.resume(class);
        h.note_resume(class.label());
    }
}

/// A subscriber's send completed: counted, and its first carrying an event timed from the
/// request's head (`gateway_resume_first_event_seconds` for a resume, and `first_event_us` on
/// its access line).
pub(super) fn sent(shared: &Shared, core: usize, conn: &mut Conn, sent: Sent, now: Instant) {
    let m = &shared.metrics[core];
    count_sent(m, sent);
    if sent.events_sent > 0
        && let Some(t) = conn.woken.take()
    {
        m.delivery_lag.observe(now.saturating_duration_since(t));
    }
    let first = |r: &&mut Box<Record>| r.first_event.is_none() && sent.events_sent > 0;
    if let Some(r) = conn.record.as_mut().filter(first) {
        let d = now.saturating_duration_since(r.started);
        r.first_event = Some(d);
        if let Some(i) = r.resume.and_then(metrics::served_resume_index) {
            m.first_event[i].observe(d);
        }
    }
}

/// A subscriber of a stream whose visible tail moved at `now` (`None`: the connection is
/// gone): its delivery lag runs from the first such move not yet sent. True if it is live.
pub(super) fn woken(conn: Option<&mut Conn>, now: Instant) -> bool {
    let Some(c) = conn else {
        return false;
    };
    c.woken.get_or_insert(now);
    true
}

/// The connection becomes a subscriber: its record waits for the subscription's end.
pub(super) fn keep_for_subscription(conn: &mut Conn) {
    if let State::Http(h) = &mut conn.state {
        conn.record = h.take_record();
    }
}

fn finish(shared: &Shared, core: usize, now: Instant, peer: Option<std::net::IpAddr>, f: Finished) {
    let m = &shared.metrics[core];
    m.request(f.record.route, f.status);
    let publish = match f.record.route {
        RouteClass::Publish => Some(0),
        RouteClass::Batch => Some(1),
        _ => None,
    };
    if let Some(i) = publish {
        m.publish_duration[i].observe(now.saturating_duration_since(f.record.started));
    }
    if !shared.access_log.send(access_log::line(f, now, peer)) {
        bump_own(&m.access_log_dropped_total, 1);
    }
}
