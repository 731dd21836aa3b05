//! Optional scrape of the server's Prometheus text (`--metrics-url`) before and after a run, so
//! a report can show what the server says it did (e.g. the gateway's resume classes: aligned,
//! replay, truncated...). Parsing is pure; [`fetch`] is a blocking one-shot HTTP GET.
//!
//! It does not understand Prometheus types, escapes in label values, or timestamps: it sums
//! the sample values of one metric family grouped by one label, which is all a report needs.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::target::UrlTemplate;

/// Sum the samples of `family` grouped by the value of `label` (samples without the label are
/// grouped under "").
pub fn sum_by_label(text: &str, family: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(family) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once('}') {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue, // a longer family name sharing the prefix
        };
        let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let key = labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| k.trim() == label)
            .map(|(_, v)| v.trim().trim_matches('"').to_string())
            .unwrap_or_default();
        *out.entry(key).or_insert(0.0) += v;
    }
    out
}

/// After minus before, per key (keys only in `after` count from 0).
pub fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// GET the URL (no `{stream}` placeholder) and return the body; `Connection: close`.
pub fn fetch(url: &UrlTemplate, timeout: Duration) -> Result<String, String> {
    let mut sock = TcpStream::connect_timeout(&url.addr, timeout)
        .map_err(|e| format!("metrics connect {}: {e}", url.addr))?;
    sock.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut req = b"GET ".to_vec();
    url.render_path("", &mut req);
    req.extend_from_slice(
        format!(
            " HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            url.host_header
        )
        .as_bytes(),
    );
    sock.write_all(&req)
        .map_err(|e| format!("metrics write: {e}"))?;
    let mut buf = Vec::new();
    sock.read_to_end(&mut buf)
        .map_err(|e| format!("metrics read: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("metrics response has no header end")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "metrics answered {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_over_cores_by_class() {
        let t = "# TYPE gateway_resumes_total counter\n\
                 gateway_resumes_total{core=\"0\",class=\"aligned\"} 3\n\
                 gateway_resumes_total{core=\"1\",class=\"aligned\"} 4\n\
                 gateway_resumes_total{core=\"0\",class=\"replay\"} 1\n\
                 gateway_resumes_total_other{class=\"aligned\"} 100\n\
                 gateway_resumes_total 2\n";
        let m = sum_by_label(t, "gateway_resumes_total", "class");
        assert_eq!(m.get("aligned"), Some(&7.0));
        assert_eq!(m.get("replay"), Some(&1.0));
        assert_eq!(m.get(""), Some(&2.0));
        let mut before = BTreeMap::new();
        before.insert("aligned".to_string(), 5.0);
        let d = delta(&before, &m);
        assert_eq!(d.get("aligned"), Some(&2.0));
        assert_eq!(d.get("replay"), Some(&1.0));
    }
}
