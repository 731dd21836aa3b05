//! Which proxy reaches the upstream, decided once at start from the usual variables (as curl
//! reads them): `https_proxy`/`HTTPS_PROXY` for an `https://` upstream, `http_proxy`/
//! `HTTP_PROXY` for an `http://` one, else `all_proxy`/`ALL_PROXY`; `no_proxy`/`NO_PROXY`
//! (comma-separated: `host`, `.domain` or `*.domain` for its subdomains, `*` for all) exempts
//! the upstream's host. ureq tunnels through the proxy with `CONNECT` (plain `http://` and
//! `https://` proxies; TLS to the upstream goes end to end inside the tunnel). A variable that
//! is set but unusable is refused at start, never ignored.

use std::collections::HashMap;
use ureq::http::Uri;
use ureq::{Proxy, ProxyProtocol};

/// The proxy variables of the environment (or of a test), by name.
#[derive(Debug, Clone, Default)]
pub struct ProxyEnv(pub HashMap<String, String>);

/// The names read, in the order they are tried per upstream scheme.
const HTTPS: [&str; 4] = ["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"];
const HTTP: [&str; 4] = ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"];
const NO_PROXY: [&str; 2] = ["no_proxy", "NO_PROXY"];

impl ProxyEnv {
    /// The process's proxy variables (empty values count as unset).
    pub fn from_process() -> ProxyEnv {
        let names = HTTPS.iter().chain(&HTTP).chain(&NO_PROXY);
        ProxyEnv(
            names
                .filter_map(|n| Some((n.to_string(), std::env::var(n).ok()?)))
                .filter(|(_, v)| !v.trim().is_empty())
                .collect(),
        )
    }

    fn first<'a>(&'a self, names: &[&'static str]) -> Option<(&'static str, &'a str)> {
        names
            .iter()
            .find_map(|n| Some((*n, self.0.get(*n)?.as_str())))
    }

    /// The proxy towards `uri` (None: direct). The error names the variable, never its value
    /// (it may hold a password).
    pub(super) fn proxy_for(&self, uri: &Uri) -> Result<Option<Proxy>, String> {
        let https = uri.scheme_str() == Some("https");
        let Some((name, value)) = self.first(if https { &HTTPS } else { &HTTP }) else {
            return Ok(None);
        };
        let host = uri.host().unwrap_or_default();
        if let Some((_, list)) = self.first(&NO_PROXY)
            && exempt(list, host)
        {
            return Ok(None);
        }
        let p = Proxy::new(value.trim()).map_err(|e| format!("{name}: {e}"))?;
        if !matches!(p.protocol(), ProxyProtocol::Http | ProxyProtocol::Https) {
            return Err(format!(
                "{name}: only http:// and https:// proxies are supported"
            ));
        }
        Ok(Some(p))
    }
}

/// Whether a `no_proxy` list names `host` (ASCII case-insensitive; an IPv6 literal with or
/// without brackets; a `:port` on an entry is ignored).
fn exempt(list: &str, host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = host.to_ascii_lowercase();
    list.split(',').map(str::trim).any(|e| {
        let e = e.to_ascii_lowercase();
        let e = match e.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => &e,
        };
        let e = e.trim_start_matches('[').trim_end_matches(']');
        match e {
            "" => false,
            "*" => true,
            _ => match e.strip_prefix('*').unwrap_or(e).strip_prefix('.') {
                Some(domain) => host.ends_with(&format!(".{domain}")),
                None => host == e,
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> ProxyEnv {
        ProxyEnv(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn host_of(p: Option<Proxy>) -> Option<String> {
        p.map(|p| format!("{}:{}", p.host(), p.port()))
    }

    #[test]
    fn the_variable_follows_the_upstream_scheme() {
        let e = env(&[("HTTPS_PROXY", "http://s:1"), ("http_proxy", "p:2")]);
        let https: Uri = "https://up.example/mcp".parse().unwrap();
        let http: Uri = "http://up.example/mcp".parse().unwrap();
        assert_eq!(host_of(e.proxy_for(&https).unwrap()), Some("s:1".into()));
        assert_eq!(host_of(e.proxy_for(&http).unwrap()), Some("p:2".into()));
        let all = env(&[("ALL_PROXY", "http://a:3")]);
        assert_eq!(host_of(all.proxy_for(&http).unwrap()), Some("a:3".into()));
        assert_eq!(env(&[]).proxy_for(&http).unwrap(), None);
    }

    #[test]
    fn no_proxy_exempts_the_upstream_host() {
        let uri: Uri = "https://mcp.Internal.example:8443/mcp".parse().unwrap();
        for list in [
            "*",
            "mcp.internal.example",
            ".internal.example",
            "x, *.example:443",
        ] {
            let e = env(&[("https_proxy", "http://s:1"), ("NO_PROXY", list)]);
            assert_eq!(e.proxy_for(&uri).unwrap(), None, "{list}");
        }
        for list in ["internal.example", "other.example", ""] {
            let e = env(&[("https_proxy", "http://s:1"), ("no_proxy", list)]);
            assert!(e.proxy_for(&uri).unwrap().is_some(), "{list}");
        }
        assert!(exempt("::1", "[::1]") && exempt("[::1]", "::1"));
    }

    /// A proxy that cannot be used stops the start; the message names the variable and
    /// never its value (it may carry a password).
    #[test]
    fn unusable_proxies_are_refused_by_name() {
        let uri: Uri = "http://up/mcp".parse().unwrap();
        for value in ["ftp://user:secret@p:1", "socks5://user:secret@p:1"] {
            let e = env(&[("http_proxy", value)]).proxy_for(&uri).unwrap_err();
            assert!(e.starts_with("http_proxy: "), "{e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }
}
