//! The `mcp` scenario over loopback against a tiny fake MCP front (std::net, thread per
//! connection): initialize, notifications/initialized, tools/call answered as an SSE stream of
//! progress notifications and a result, resume by GET + Last-Event-ID, DELETE. Told to
//! misbehave on resume (skip or repeat an event), it must be caught; behaving, it must not.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use bench::mcp::{self, McpConfig};
use bench::target::UrlTemplate;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// On every resume, skip the first event after the resume point.
    SkipOnResume,
    /// On every resume, send the resume point's event again.
    RepeatOnResume,
}

struct FakeMcp {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Drop for FakeMcp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn start(fault: Fault) -> FakeMcp {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    thread::spawn(move || {
        for c in listener.incoming() {
            if st.load(Ordering::SeqCst) {
                break;
            }
            if let Ok(c) = c {
                thread::spawn(move || {
                    let _ = serve(c, fault);
                });
            }
        }
    });
    FakeMcp { addr, stop }
}

/// Event `seq` (1-based) of call `call` with `count` progress notifications: 1 = priming,
/// 2..=count+1 = progress seq-1, count+2 = the result.
fn event(call: u64, count: u64, seq: u64) -> String {
    let data = if seq == 1 {
        String::new()
    } else if seq <= count + 1 {
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progress":{},"progressToken":"t{call}","total":{count}}}}}"#,
            seq - 1
        )
    } else {
        format!(
            r#"{{"id":{call},"jsonrpc":"2.0","result":{{"structuredContent":{{"sent":{count}}}}}}}"#
        )
    };
    format!("id: 00000000000000aa-{call}-{seq}\ndata: {data}\n\n")
}

fn field(body: &str, key: &str) -> Option<u64> {
    let i = body.find(key)? + key.len();
    body[i..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .ok()
}

fn serve(conn: TcpStream, fault: Fault) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let method = line.split_whitespace().next().unwrap_or("").to_string();
    let mut len = 0;
    let mut last_id = None;
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((h, ""));
        match k.to_ascii_lowercase().as_str() {
            "content-length" => len = v.trim().parse().unwrap_or(0),
            "last-event-id" => last_id = Some(v.trim().to_string()),
            _ => {}
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    let body = String::from_utf8_lossy(&body).into_owned();
    let sse_head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\nretry: 1000\n\n";
    if method == "DELETE" {
        return w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    }
    if body.contains("\"initialize\"") {
        let b = r#"{"jsonrpc":"2.0","id":0,"result":{}}"#;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: s1\r\nContent-Length: {}\r\n\r\n",
            b.len()
        );
        return w.write_all(format!("{head}{b}").as_bytes());
    }
    if body.contains("notifications/initialized") {
        return w.write_all(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n");
    }
    let (call, count, from) = if method == "POST" {
        // tools/call: the whole stream from the priming event on.
        (
            field(&body, "\"id\":").unwrap(),
            field(&body, "\"count\":").unwrap(),
            1,
        )
    } else {
        // Resume: the ID "<epoch>-<call>-<seq>" names the call and the position; every call
        // of this fake has COUNT progress notifications.
        let id = last_id.expect("GET without Last-Event-ID");
        let mut parts = id.rsplitn(3, '-');
        let seq: u64 = parts.next().unwrap().parse().unwrap();
        let call: u64 = parts.next().unwrap().parse().unwrap();
        w.write_all(sse_head.as_bytes())?;
        w.write_all(format!("id: {id}\ndata: \n\n").as_bytes())?; // priming at the resume point
        let mut next = seq + 1;
        match fault {
            Fault::None => {}
            Fault::SkipOnResume => next += 1,
            Fault::RepeatOnResume => next = seq.max(2),
        }
        for s in next..=COUNT + 2 {
            w.write_all(event(call, COUNT, s).as_bytes())?;
        }
        return Ok(());
    };
    assert_eq!(count, COUNT);
    w.write_all(sse_head.as_bytes())?;
    for s in from..=count + 2 {
        w.write_all(event(call, count, s).as_bytes())?;
    }
    Ok(())
}

const COUNT: u64 = 50;

fn config(addr: SocketAddr) -> McpConfig {
    McpConfig {
        url: UrlTemplate::parse(&format!("http://{addr}/mcp")).unwrap(),
        sessions: 3,
        calls_per_session: 2,
        progress_count: COUNT,
        interval_ms: 0,
        cuts_per_call: 2,
        cut_bytes_max: 2000,
        timeout_secs: 5.0,
        seed: 3,
        progress_interval_secs: 0,
    }
}

#[test]
fn correct_front_gives_exactly_once_progress() {
    let srv = start(Fault::None);
    let r = mcp::run(&config(srv.addr), "fake").unwrap();
    assert_eq!(r.sessions_up, 3, "{:?}", r.errors);
    assert_eq!(r.calls_completed, 6, "{:?}", r.errors);
    assert_eq!(r.check.events, 6 * COUNT);
    assert_eq!(r.cuts, 12);
    assert_eq!(r.resumes, 12);
    assert_eq!(r.violations, 0, "{:?} {:?}", r.check, r.errors);
}

#[test]
fn skipped_event_on_resume_is_a_gap() {
    let srv = start(Fault::SkipOnResume);
    let r = mcp::run(&config(srv.addr), "fake").unwrap();
    assert!(r.check.gaps > 0, "{:?}", r.check);
    assert!(r.violations > 0);
}

#[test]
fn repeated_event_on_resume_is_a_duplicate() {
    let srv = start(Fault::RepeatOnResume);
    let r = mcp::run(&config(srv.addr), "fake").unwrap();
    assert!(r.check.duplicates > 0, "{:?}", r.check);
    assert!(r.violations > 0);
}
