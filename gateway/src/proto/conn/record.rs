//! A connection's access-log records: who asked, the `X-Request-Id` every answer carries, and
//! the requests whose final answer left, until the core takes them.
#![forbid(unsafe_code)]

use super::super::request_log::{Finished, Record, fingerprint};
use super::HttpConn;

impl HttpConn {
    /// Records who asked (a fingerprint of the verified subject).
    pub(super) fn note_subject(&mut self, access: &auth::Access) {
        if let (Some(r), Some(s)) = (&mut self.record, &access.subject) {
            r.subject = Some(fingerprint(s));
        }
    }

    /// The extra header lines of every answer to the request being handled: the gate's (CORS)
    /// and its `X-Request-Id`.
    pub(super) fn answer_headers(&self) -> String {
        match &self.record {
            Some(r) => format!("{}{}", self.headers, r.header_line()),
            None => self.headers.clone(),
        }
    }

    /// Takes the record of the request being handled (a subscription, whose line is written
    /// when it ends).
    pub fn take_record(&mut self) -> Option<Box<Record>> {
        self.record.take()
    }

    /// Puts a resume's class on the record of the request being handled.
    pub fn note_resume(&mut self, class: &'static str) {
        if let Some(r) = &mut self.record {
            r.resume = Some(class);
        }
    }

    /// Hands every request whose final answer left the outbox to `f`.
    pub fn drain_finished(&mut self, f: impl FnMut(Finished)) {
        self.finished.drain(..).for_each(f);
    }
}
