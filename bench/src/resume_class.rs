//! How the server classified a resume, read from the `X-Resume-Class` header of the resumed
//! subscription's 200 response head (the gateway sends `aligned`, `replay`, `up-to-date` or
//! `truncated`; nchan sends nothing, which is the class `none`), and the per-class resume
//! latency histograms (reconnect, i.e. the resume's `connect()`, → 200 head and → first event).
//!
//! Pure: header bytes in, a class out; histograms are filled by the load driver. It does not
//! decide anything about correctness (that is `checker`, which runs whatever the class).

use hdrhistogram::Histogram;

/// The response header naming the class (compared case-insensitively).
pub const HEADER: &str = "x-resume-class";

/// A resume's class as the server announced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeClass {
    /// Served from the parked send window (the window's head was N+1).
    Aligned,
    /// Served from the log.
    Replay,
    /// N was the newest event: live from N+1.
    UpToDate,
    /// In-band `event: truncated` answer (`?on_truncated=earliest|latest`).
    Truncated,
    /// A header value this bench does not know (or conflicting duplicate headers).
    Other,
    /// No header at all (a server that does not classify, e.g. nchan).
    None,
}

impl ResumeClass {
    /// Every class, in report order; `index()` is the position here.
    pub const ALL: [ResumeClass; 6] = [
        ResumeClass::Aligned,
        ResumeClass::Replay,
        ResumeClass::UpToDate,
        ResumeClass::Truncated,
        ResumeClass::Other,
        ResumeClass::None,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn label(self) -> &'static str {
        match self {
            ResumeClass::Aligned => "aligned",
            ResumeClass::Replay => "replay",
            ResumeClass::UpToDate => "up-to-date",
            ResumeClass::Truncated => "truncated",
            ResumeClass::Other => "other",
            ResumeClass::None => "none",
        }
    }

    /// The class a header value names (surrounding whitespace ignored, case-insensitive).
    pub fn from_value(value: &[u8]) -> ResumeClass {
        let v = value.trim_ascii();
        [
            ResumeClass::Aligned,
            ResumeClass::Replay,
            ResumeClass::UpToDate,
            ResumeClass::Truncated,
        ]
        .into_iter()
        .find(|c| v.eq_ignore_ascii_case(c.label().as_bytes()))
        .unwrap_or(ResumeClass::Other)
    }

    /// The class announced by a response's headers (`(name, value)` pairs): `None` without
    /// the header, `Other` when repeated with different values.
    pub fn from_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Self {
        let mut found = ResumeClass::None;
        for (name, value) in headers {
            if name.eq_ignore_ascii_case(HEADER) {
                let c = ResumeClass::from_value(value);
                found = match found {
                    ResumeClass::None => c,
                    prev if prev == c => c,
                    _ => ResumeClass::Other,
                };
            }
        }
        found
    }
}

/// Resume counts and latencies per class, over one run.
#[derive(Debug, Clone)]
pub struct ByClass {
    /// Resumes answered with a 200 head, per class (all of them, timed or not).
    pub resumes: [u64; 6],
    /// Reconnect (the resume's `connect()`) → the 200 head, ns; only resumes that follow a
    /// bench cut are timed.
    pub to_head_ns: [Histogram<u64>; 6],
    /// Reconnect → the first event on the new connection, ns.
    pub to_first_event_ns: [Histogram<u64>; 6],
}

impl ByClass {
    pub fn new(new_hist: impl Fn() -> Histogram<u64>) -> Self {
        Self {
            resumes: [0; 6],
            to_head_ns: std::array::from_fn(|_| new_hist()),
            to_first_event_ns: std::array::from_fn(|_| new_hist()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_map_to_classes() {
        assert_eq!(ResumeClass::from_value(b"aligned"), ResumeClass::Aligned);
        assert_eq!(ResumeClass::from_value(b" replay\t"), ResumeClass::Replay);
        assert_eq!(
            ResumeClass::from_value(b"Up-To-Date"),
            ResumeClass::UpToDate
        );
        assert_eq!(
            ResumeClass::from_value(b"truncated"),
            ResumeClass::Truncated
        );
        // The metrics label spelling is not the header's.
        assert_eq!(ResumeClass::from_value(b"up_to_date"), ResumeClass::Other);
        assert_eq!(ResumeClass::from_value(b""), ResumeClass::Other);
        assert_eq!(ResumeClass::from_value(b"alignedx"), ResumeClass::Other);
    }

    #[test]
    fn headers_are_searched_case_insensitively() {
        let h: [(&str, &[u8]); 3] = [
            ("Content-Type", b"text/event-stream"),
            ("X-Resume-Class", b"aligned"),
            ("Connection", b"close"),
        ];
        assert_eq!(ResumeClass::from_headers(h), ResumeClass::Aligned);
        let h: [(&str, &[u8]); 1] = [("x-resume-CLASS", b"replay")];
        assert_eq!(ResumeClass::from_headers(h), ResumeClass::Replay);
    }

    #[test]
    fn missing_and_conflicting_headers() {
        let h: [(&str, &[u8]); 1] = [("Content-Type", b"text/event-stream")];
        assert_eq!(ResumeClass::from_headers(h), ResumeClass::None);
        let h: [(&str, &[u8]); 2] = [
            ("X-Resume-Class", b"aligned"),
            ("X-Resume-Class", b"replay"),
        ];
        assert_eq!(ResumeClass::from_headers(h), ResumeClass::Other);
        let h: [(&str, &[u8]); 2] = [("X-Resume-Class", b"replay"), ("X-Resume-Class", b"replay")];
        assert_eq!(ResumeClass::from_headers(h), ResumeClass::Replay);
    }

    /// As the load driver sees it: a whole response head parsed by httparse.
    #[test]
    fn from_a_parsed_response_head() {
        let head =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
Connection: close\r\nX-Accel-Buffering: no\r\nX-Resume-Class: up-to-date\r\n\r\nretry: 500\n\n";
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut resp = httparse::Response::new(&mut headers);
        assert!(resp.parse(head).unwrap().is_complete());
        let class = ResumeClass::from_headers(resp.headers.iter().map(|h| (h.name, h.value)));
        assert_eq!(class, ResumeClass::UpToDate);
    }

    #[test]
    fn index_is_position_in_all() {
        for (i, c) in ResumeClass::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
        let labels: std::collections::HashSet<_> =
            ResumeClass::ALL.iter().map(|c| c.label()).collect();
        assert_eq!(labels.len(), ResumeClass::ALL.len());
    }
}
