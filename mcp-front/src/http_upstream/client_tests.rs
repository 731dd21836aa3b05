//! The client against loopback servers of the tests' own: a name resolving to several
//! addresses (the first refusing), a name whose addresses change between connections, and a
//! proxy taken from the proxy variables (and skipped under `NO_PROXY`).

use super::*;
use crossbeam::channel::Receiver;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicUsize;
use ureq::unversioned::resolver::ResolvedSocketAddrs;
use ureq::unversioned::transport::NextTimeout;

/// A minimal MCP server: `initialize` gets a session, a request its id echoed in a result, a
/// notification 202, GET 405. It counts its connections and names itself in each result.
struct Server {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl Server {
    fn start(name: &'static str) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let n = accepted.clone();
        std::thread::spawn(move || {
            for s in l.incoming().map_while(Result::ok) {
                n.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || serve(s, name));
            }
        });
        Server { addr, accepted }
    }
}

/// One request's head lines and body, or None at EOF.
fn read_request(r: &mut impl BufRead) -> Option<(Vec<String>, Vec<u8>)> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end().to_owned();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let len = head
        .iter()
        .find_map(|h| {
            h.to_ascii_lowercase()
                .strip_prefix("content-length:")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((head, body))
}

fn serve(s: TcpStream, name: &str) {
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    while let Some((head, body)) = read_request(&mut r) {
        let msg: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let answer = match (head[0].split(' ').next(), msg.get("id")) {
            (Some("POST"), Some(id)) => {
                let res = serde_json::json!({"jsonrpc":"2.0","id":id,"result":{"server":name}});
                let res = res.to_string();
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: s1\r\nContent-Length: {}\r\n\r\n{res}",
                    res.len()
                )
            }
            (Some("GET"), _) => {
                "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n".into()
            }
            _ => "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n".into(),
        };
        if w.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Answers with whatever addresses the test put in, counting the calls.
#[derive(Debug, Default)]
struct ListResolver {
    addrs: Mutex<Vec<SocketAddr>>,
    calls: AtomicUsize,
}

impl Resolver for ListResolver {
    fn resolve(
        &self,
        _uri: &Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut out = self.empty();
        for a in self.addrs.lock().unwrap().iter() {
            out.push(*a);
        }
        Ok(out)
    }
}

/// An address that refuses: a loopback port nobody listens on.
fn refusing() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn options(pool_connections_max: usize, proxy: &[(&str, String)]) -> HttpOptions {
    HttpOptions {
        ca_files: Vec::new(),
        pool_connections_max,
        pool_idle: Duration::from_secs(30),
        proxy_env: ProxyEnv(
            proxy
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        ),
    }
}

/// A started client and its event channel.
fn client(ep: Arc<HttpEndpoint>) -> (HttpUpstream, Receiver<UpstreamEvent>) {
    let (tx, rx) = channel::unbounded();
    let up = HttpUpstream::start(UpstreamId(1), ep, 1 << 20, 16, tx, Arc::new(|| {})).unwrap();
    (up, rx)
}

/// Sends a request and returns the `server` of its result (or the failure).
fn call(up: &HttpUpstream, rx: &Receiver<UpstreamEvent>, id: u64, method: &str) -> String {
    let line = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{}}}}"#);
    let msg = Outbound {
        line: line.into_bytes(),
        authorization: None,
    };
    up.lines().unwrap().send(msg).unwrap();
    match rx.recv_timeout(Duration::from_secs(20)).expect("an event") {
        UpstreamEvent::Line(_, l) => {
            let v: Value = serde_json::from_slice(&l).unwrap();
            assert_eq!(v["id"], id, "{v}");
            v["result"]["server"].as_str().unwrap_or("none").to_owned()
        }
        other => format!("{other:?}"),
    }
}

/// Each new connection resolves the name again and tries every address: the first refuses,
/// the second answers; once the name moves to another server, the next connection finds it.
/// (The client this replaced resolved once at start and took the first address only.)
#[test]
fn every_address_is_tried_and_each_connection_resolves_again() {
    let (a, b) = (Server::start("a"), Server::start("b"));
    let resolver = Arc::new(ListResolver::default());
    *resolver.addrs.lock().unwrap() = vec![refusing(), a.addr];
    let url = "http://upstream.test:9/mcp";
    let ep = HttpEndpoint::with_resolver(url, &options(0, &[]), resolver.clone()).unwrap();
    let (up, rx) = client(ep.clone());
    assert_eq!(call(&up, &rx, 0, "initialize"), "a");
    assert_eq!(call(&up, &rx, 1, "ping"), "a");
    *resolver.addrs.lock().unwrap() = vec![refusing(), refusing(), b.addr];
    assert_eq!(call(&up, &rx, 2, "ping"), "b");
    assert!(resolver.calls.load(Ordering::SeqCst) >= 3);
    assert!(b.accepted.load(Ordering::SeqCst) >= 1);
    assert_eq!(ep.stats().requests_retried, 0);
}

/// A proxy that records each request line (a `CONNECT`) and refuses it (403). (A tunnelling
/// one carries an `https://` upstream in `gateway/tests/mcp_http_upstream.rs`.)
struct RefusingProxy {
    addr: SocketAddr,
    targets: Arc<Mutex<Vec<String>>>,
}

impl RefusingProxy {
    fn start() -> RefusingProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let targets = Arc::new(Mutex::new(Vec::new()));
        let t = targets.clone();
        std::thread::spawn(move || {
            for mut s in l.incoming().map_while(Result::ok) {
                if let Some((head, _)) = read_request(&mut BufReader::new(&s)) {
                    t.lock().unwrap().push(head[0].clone());
                }
                let _ = s.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
            }
        });
        RefusingProxy { addr, targets }
    }
}

/// `http_proxy` sends an `http://` upstream's requests to the proxy (`CONNECT`; refused here:
/// the upstream fails, naming the proxy); `HTTPS_PROXY` alone does not, nor `HTTP_PROXY` with
/// `NO_PROXY` naming the upstream's host: those go direct.
#[test]
fn proxy_variables_are_honoured() {
    let (up_server, proxy) = (Server::start("up"), RefusingProxy::start());
    let url = format!("http://{}/mcp", up_server.addr);
    let via = format!("http://{}", proxy.addr);
    let ep = HttpEndpoint::new(&url, &options(4, &[("http_proxy", via.clone())])).unwrap();
    assert!(ep.proxied());
    let (up, rx) = client(ep);
    let failed = call(&up, &rx, 0, "initialize");
    assert!(
        failed.starts_with("Failed(") && failed.contains("proxy"),
        "{failed}"
    );
    let connect = format!("CONNECT {} HTTP/1.1", up_server.addr);
    assert_eq!(*proxy.targets.lock().unwrap(), vec![connect]);
    assert_eq!(up_server.accepted.load(Ordering::SeqCst), 0);

    let no_proxy = "localhost,127.0.0.1".to_owned();
    for vars in [
        vec![("HTTPS_PROXY", via.clone())],
        vec![("HTTP_PROXY", via.clone()), ("NO_PROXY", no_proxy)],
    ] {
        let ep = HttpEndpoint::new(&url, &options(4, &vars)).unwrap();
        assert!(!ep.proxied(), "{vars:?}");
        let (up, rx) = client(ep);
        assert_eq!(call(&up, &rx, 0, "initialize"), "up", "{vars:?}");
        assert_eq!(call(&up, &rx, 1, "ping"), "up", "{vars:?}");
    }
    assert_eq!(proxy.targets.lock().unwrap().len(), 1, "no CONNECT since");
}
