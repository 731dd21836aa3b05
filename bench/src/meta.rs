//! The `meta` object of a `--json` report: what was run, from which commit, on what machine
//! and how loaded it was at the start — so a result file says where its figures come from.
//!
//! The parsers are pure (text in, values out); [`Meta::collect`] reads `/proc` and `/sys` once.

use serde::Serialize;

/// The commit the bench was built from (`bench/build.rs`: `git rev-parse --short=12 HEAD`,
/// `unknown` outside a checkout). Run from the same tree, it is the gateway's commit too.
pub const COMMIT: &str = env!("BENCH_COMMIT");

/// Where a run's figures come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Meta {
    /// The bench's commit ([`COMMIT`]).
    pub commit: String,
    /// The bench's version (Cargo).
    pub version: &'static str,
    /// The bench's own command line, program name first, with the value of every
    /// `access_token=` query parameter (a token in a URL template) replaced by `REDACTED`.
    pub argv: Vec<String>,
    /// Start of the run, seconds since the Unix epoch (UTC).
    pub started_unix_secs: u64,
    /// CPUs online on the machine (`/sys/devices/system/cpu/online`).
    pub cpus_online: Option<u32>,
    /// CPUs the bench may run on (its affinity: `taskset` pins it).
    pub bench_cpus_allowed: Option<u32>,
    /// The kernel release (`uname -r`, from `/proc/sys/kernel/osrelease`).
    pub kernel_release: Option<String>,
    /// 1, 5 and 15 minute load averages at the start (`/proc/loadavg`): on a shared machine,
    /// how much else was running.
    pub loadavg_start: Option<[f64; 3]>,
}

impl Meta {
    /// Reads the machine's figures now; `argv` is the bench's command line.
    pub fn collect(argv: impl IntoIterator<Item = String>) -> Meta {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        Meta {
            commit: COMMIT.to_owned(),
            version: env!("CARGO_PKG_VERSION"),
            argv: argv.into_iter().map(|a| redact_tokens(&a)).collect(),
            started_unix_secs: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            cpus_online: read("/sys/devices/system/cpu/online").and_then(|s| count_cpu_list(&s)),
            bench_cpus_allowed: rustix::thread::sched_getaffinity(None)
                .ok()
                .map(|set| set.count()),
            kernel_release: read("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty()),
            loadavg_start: read("/proc/loadavg").and_then(|s| parse_loadavg(&s)),
        }
    }
}

/// The query parameter that carries a token in a URL (RFC 6750 §2.3; the gateway accepts it
/// with `--jwt-allow-query-token`).
const TOKEN_PARAM: &str = "access_token=";

/// `arg` with the value of every `access_token=` parameter (up to the next `&`, `#` or the
/// end) replaced by `REDACTED`: a report never carries a token.
pub fn redact_tokens(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(at) = find_token_param(rest) {
        let value = at + TOKEN_PARAM.len();
        out.push_str(&rest[..value]);
        out.push_str("REDACTED");
        let end = rest[value..]
            .find(['&', '#'])
            .map_or(rest.len(), |e| value + e);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where the next `access_token=` (any case) starts as a query parameter: after `?`, `&` or
/// `;`, or at the start of the argument.
fn find_token_param(s: &str) -> Option<usize> {
    let lower = s.to_ascii_lowercase();
    let mut from = 0;
    while let Some(i) = lower[from..].find(TOKEN_PARAM).map(|i| from + i) {
        if i == 0 || matches!(lower.as_bytes()[i - 1], b'?' | b'&' | b';') {
            return Some(i);
        }
        from = i + TOKEN_PARAM.len();
    }
    None
}

/// The number of CPUs in a kernel CPU list such as `0-3,8,10-11` (`None` if malformed).
pub fn count_cpu_list(list: &str) -> Option<u32> {
    let list = list.trim();
    if list.is_empty() {
        return None;
    }
    let mut n = 0u32;
    for part in list.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let c = part.parse::<u32>().ok()?;
                (c, c)
            }
        };
        n = n.checked_add(hi.checked_sub(lo)?.checked_add(1)?)?;
    }
    Some(n)
}

/// The three load averages of `/proc/loadavg` (`0.52 0.58 0.59 2/345 12345`).
pub fn parse_loadavg(text: &str) -> Option<[f64; 3]> {
    let mut it = text.split_ascii_whitespace().map(str::parse::<f64>);
    let one = it.next()?.ok()?;
    let five = it.next()?.ok()?;
    let fifteen = it.next()?.ok()?;
    Some([one, five, fifteen])
}

/// `report` as a JSON object with a `meta` key added beside its own (a report that is not an
/// object is wrapped as `{"meta": …, "report": …}`).
pub fn with_meta(meta: &Meta, report: serde_json::Value) -> serde_json::Value {
    let meta = serde_json::to_value(meta).expect("meta serialises");
    let mut out = serde_json::Map::new();
    out.insert("meta".to_owned(), meta);
    match report {
        serde_json::Value::Object(fields) => out.extend(fields),
        other => {
            out.insert("report".to_owned(), other);
        }
    }
    serde_json::Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_ranges_and_singles() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
    }

    #[test]
    fn malformed_cpu_lists_are_none() {
        for bad in ["", "\n", "a", "3-1", "0-", "-2", "0,,1", "0-1-2"] {
            assert_eq!(count_cpu_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn loadavg_takes_the_three_averages() {
        assert_eq!(
            parse_loadavg("0.52 1.58 10.00 2/345 12345\n"),
            Some([0.52, 1.58, 10.0])
        );
        assert_eq!(parse_loadavg("0.52 1.58"), None);
        assert_eq!(parse_loadavg("x 1 2"), None);
    }

    #[test]
    fn meta_is_added_and_the_report_keeps_its_fields() {
        let meta = Meta {
            commit: "0123456789ab".into(),
            version: "0.1.0",
            argv: vec!["bench".into(), "durable".into(), "--json".into()],
            started_unix_secs: 1,
            cpus_online: Some(2),
            bench_cpus_allowed: Some(1),
            kernel_release: Some("6.1.0".into()),
            loadavg_start: Some([0.5, 0.25, 0.125]),
        };
        let v = with_meta(&meta, serde_json::json!({"rows": [1, 2], "note": null}));
        let mut keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["meta", "note", "rows"]);
        assert_eq!(v["meta"]["commit"], "0123456789ab");
        assert_eq!(v["meta"]["argv"][1], "durable");
        assert_eq!(v["meta"]["cpus_online"], 2);
        assert_eq!(v["meta"]["kernel_release"], "6.1.0");
        assert_eq!(v["meta"]["loadavg_start"][2], 0.125);
        assert_eq!(v["rows"][1], 2);
        let wrapped = with_meta(&meta, serde_json::json!([1]));
        assert_eq!(wrapped["report"][0], 1);
    }

    #[test]
    fn tokens_in_urls_are_redacted() {
        let r = redact_tokens;
        assert_eq!(
            r("http://h/v1/streams/{stream}?access_token=eyJ.a.b"),
            "http://h/v1/streams/{stream}?access_token=REDACTED"
        );
        assert_eq!(
            r("http://h/s?x=1&ACCESS_TOKEN=t0k&y=2#f"),
            "http://h/s?x=1&ACCESS_TOKEN=REDACTED&y=2#f"
        );
        assert_eq!(
            r("access_token=a&access_token=b"),
            "access_token=REDACTED&access_token=REDACTED"
        );
        // Only a parameter of that name: not a suffix of another one.
        assert_eq!(
            r("http://h/s?my_access_token=x"),
            "http://h/s?my_access_token=x"
        );
        assert_eq!(r("--json"), "--json");
        let m = Meta::collect([
            "bench".to_owned(),
            "http://h/s?access_token=secret".to_owned(),
        ]);
        assert_eq!(m.argv[1], "http://h/s?access_token=REDACTED");
    }

    #[test]
    fn the_build_embeds_a_commit() {
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() == 12 && COMMIT.bytes().all(|b| b.is_ascii_hexdigit())),
            "{COMMIT}"
        );
    }

    #[test]
    fn collect_reads_this_machine() {
        let m = Meta::collect(vec!["bench".into()]);
        assert!(m.cpus_online.is_some_and(|n| n >= 1), "{m:?}");
        assert!(m.kernel_release.is_some(), "{m:?}");
        assert!(m.loadavg_start.is_some(), "{m:?}");
        assert!(m.bench_cpus_allowed.is_some_and(|n| n >= 1), "{m:?}");
    }
}
