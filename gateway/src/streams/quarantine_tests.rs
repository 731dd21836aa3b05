//! The quarantine table's tests: named cases, then every combination of a small domain
//! checked against the table's rows read one by one.

use super::*;

const SHARDS: u32 = 4;

fn cx() -> Context {
    Context {
        shards: SHARDS,
        limit: RecordLimit {
            record_bytes_max: 512,
        },
    }
}

/// A name of shard `shard` with `prefix`.
fn name_in(prefix: &str, shard: u32) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| crate::shards::shard_of(n, SHARDS) == shard)
        .unwrap()
}

fn msg<'a>(stream: Option<&'a str>, seq: Option<&'a str>, data: &'a [u8]) -> Message<'a> {
    let shard = stream.map_or(0, |s| crate::shards::shard_of(s, SHARDS));
    Message {
        shard,
        stream,
        event: None,
        seq_header: seq,
        data,
    }
}

/// Every stream's next seq is 5.
fn next5(_: &str) -> u64 {
    5
}

#[test]
fn named_cases() {
    let api = name_in("orders-", 1);
    let mcp = "mcp/s3ss10n/1";
    let big = vec![b'x'; 600];
    let long = "a".repeat(201);
    let d = b"ok".as_slice();
    let sub = |stream, reason, expected| Verdict::Substitute {
        stream,
        reason,
        expected,
    };
    let skip = |reason| Verdict::Skip { reason };
    let cases: Vec<(&str, Message<'_>, Verdict<'_>)> = vec![
        (
            "plain",
            msg(Some(&api), None, d),
            Verdict::Apply { stream: &api },
        ),
        (
            "no header",
            msg(None, None, d),
            skip(Reason::NoStreamHeader),
        ),
        (
            "empty name",
            msg(Some(""), None, d),
            skip(Reason::InvalidStreamName),
        ),
        (
            "a space",
            msg(Some("a b"), None, d),
            skip(Reason::InvalidStreamName),
        ),
        (
            "a slash",
            msg(Some("a/b"), None, d),
            skip(Reason::InvalidStreamName),
        ),
        (
            "internal",
            msg(Some(QUARANTINE_STREAM), None, d),
            skip(Reason::InvalidStreamName),
        ),
        (
            "mcp ctl",
            msg(Some("mcp/a\u{1}"), Some("5"), d),
            skip(Reason::InvalidStreamName),
        ),
        (
            "too long",
            msg(Some(&long), None, d),
            skip(Reason::InvalidStreamName),
        ),
        (
            "other shard",
            Message {
                shard: 2,
                ..msg(Some(&api), None, d)
            },
            skip(Reason::WrongShard),
        ),
        (
            "mcp no seq",
            msg(Some(mcp), None, d),
            sub(mcp, Reason::McpWithoutSeq, None),
        ),
        (
            "mcp seq ok",
            msg(Some(mcp), Some("5"), d),
            Verdict::Apply { stream: mcp },
        ),
        (
            "seq ahead",
            msg(Some(&api), Some("7"), d),
            sub(&api, Reason::SeqMismatch, Some(7)),
        ),
        (
            "seq ok",
            msg(Some(&api), Some("5"), d),
            Verdict::Apply { stream: &api },
        ),
        (
            "not utf-8",
            msg(Some(&api), None, b"\xff\xfe"),
            sub(&api, Reason::DataNotUtf8, None),
        ),
        (
            "oversized",
            msg(Some(&api), None, &big),
            sub(&api, Reason::Oversized, None),
        ),
        (
            "reserved type",
            Message {
                event: Some("truncated"),
                ..msg(Some(&api), None, d)
            },
            sub(&api, Reason::BadEventType, None),
        ),
        (
            "line break",
            Message {
                event: Some("a\nb"),
                ..msg(Some(&api), None, d)
            },
            sub(&api, Reason::BadEventType, None),
        ),
    ];
    for (what, m, want) in cases {
        assert_eq!(decide(&m, &cx(), next5), want, "{what}");
    }
    for bad in ["x", "0", "+5", "05", "99999999999999999999"] {
        let m = msg(Some(&api), Some(bad), d);
        let want = sub(&api, Reason::BadSeqHeader, None);
        assert_eq!(decide(&m, &cx(), next5), want, "Gw-Seq {bad}");
    }
}

#[test]
fn error_records_fit_the_smallest_limit_and_name_only_the_reason() {
    let limit = RecordLimit {
        record_bytes_max: 512,
    };
    for r in Reason::ALL {
        let (t, d) = error_record(r);
        assert!(limit.overflow_any_id(t, &d).is_none(), "{r:?}");
        let (t, d) = skip_record(r, u64::MAX);
        assert!(limit.overflow_any_id(t, &d).is_none(), "{r:?}");
        assert_eq!(Reason::ALL[r.index()], r);
    }
}

/// The rows of the module's table as independent predicates, in order.
fn rows(m: &Message<'_>, next: u64) -> Vec<(bool, Reason)> {
    let name = m.stream.unwrap_or("");
    let kind = StreamKind::of(name);
    let valid = match kind {
        StreamKind::Api => is_api_name(name),
        StreamKind::Mcp => !name.chars().any(char::is_control) && name.len() <= 200,
        StreamKind::Internal => false,
    };
    let seq: Option<Option<u64>> = m.seq_header.map(|v| {
        (!v.starts_with(['0', '+', '-']))
            .then(|| v.parse().ok())
            .flatten()
    });
    vec![
        (m.stream.is_none(), Reason::NoStreamHeader),
        (!valid, Reason::InvalidStreamName),
        (
            crate::shards::shard_of(name, SHARDS) != m.shard,
            Reason::WrongShard,
        ),
        (seq == Some(None), Reason::BadSeqHeader),
        (
            seq.is_none() && kind == StreamKind::Mcp,
            Reason::McpWithoutSeq,
        ),
        (
            seq.flatten().is_some_and(|e| e != next),
            Reason::SeqMismatch,
        ),
        (std::str::from_utf8(m.data).is_err(), Reason::DataNotUtf8),
        (
            m.event
                .is_some_and(|t| t.contains('\n') || (kind == StreamKind::Api && t == "expired")),
            Reason::BadEventType,
        ),
        (m.data.len() > 300, Reason::Oversized),
    ]
}

#[test]
fn every_combination_takes_the_first_row_that_matches_and_decides_alike_twice() {
    let api = name_in("s-", 1);
    let mcp = "mcp/x/1".to_string();
    let streams = [
        None,
        Some("bad name".to_string()),
        Some("gw/q".into()),
        Some(api),
        Some(mcp),
    ];
    let shards = [0, 1, crate::shards::shard_of("mcp/", SHARDS)];
    let seqs = [None, Some("5"), Some("6"), Some("05"), Some("z")];
    let big = "y".repeat(600);
    let datas: [&[u8]; 3] = [b"fine", b"\xc3", big.as_bytes()];
    let events = [None, Some("tick"), Some("expired"), Some("a\nb")];
    let mut seen = std::collections::HashSet::new();
    for stream in &streams {
        for &shard in &shards {
            for &seq_header in &seqs {
                for data in datas {
                    for &event in &events {
                        let m = Message {
                            shard,
                            stream: stream.as_deref(),
                            event,
                            seq_header,
                            data,
                        };
                        let got = decide(&m, &cx(), next5);
                        assert_eq!(got, decide(&m, &cx(), next5), "deterministic");
                        let first = rows(&m, 5).into_iter().find(|(hit, _)| *hit);
                        let want_reason = first.map(|(_, r)| r);
                        let got_reason = match &got {
                            Verdict::Apply { .. } => None,
                            Verdict::Substitute { reason, .. } | Verdict::Skip { reason } => {
                                Some(*reason)
                            }
                        };
                        assert_eq!(got_reason, want_reason, "{m:?}");
                        let skips = matches!(
                            want_reason,
                            Some(
                                Reason::NoStreamHeader
                                    | Reason::InvalidStreamName
                                    | Reason::WrongShard
                            )
                        );
                        assert_eq!(matches!(got, Verdict::Skip { .. }), skips, "{m:?}");
                        seen.insert(got_reason);
                    }
                }
            }
        }
    }
    assert_eq!(
        seen.len(),
        Reason::ALL.len() + 1,
        "every row and apply are reached"
    );
}
