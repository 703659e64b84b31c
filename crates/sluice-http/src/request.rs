//! An HTTP request as rules see it: the client address resolved through
//! trusted proxies. (JWT claims come from the engine, which reads only a
//! verified token.)

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use http::header::{FORWARDED, HOST};
use sluice_policy::{Policy, Request};

/// The socket peer of a connection, as a request extension. Servers that
/// don't use axum's `ConnectInfo` insert this so that rules keyed on
/// `ip:address` can see the client.
///
/// ```
/// use sluice_http::PeerAddr;
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(PeerAddr("192.0.2.1:4000".parse().unwrap()));
/// assert!(req.extensions().get::<PeerAddr>().is_some());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The socket peer of `req`: [`PeerAddr`], axum's `ConnectInfo`, or
/// tonic's `TcpConnectInfo` (with the `tonic` feature).
pub(crate) fn peer<B>(req: &http::Request<B>) -> Option<IpAddr> {
    if let Some(p) = req.extensions().get::<PeerAddr>() {
        return Some(p.0.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(c) = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(c.0.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = req
        .extensions()
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|c| c.remote_addr())
    {
        return Some(addr.ip());
    }
    None
}

/// An `http::Request` seen through a policy's trusted proxies. It has no
/// claims of its own: the engine adds those of a verified token.
///
/// ```
/// use sluice_http::HttpRequest;
/// use sluice_policy::{Policy, Request};
/// let req = http::Request::builder()
///     .uri("https://api.example.com/v1/items?tenant=acme")
///     .header("x-api-key", "k1")
///     .body(())
///     .unwrap();
/// let view = HttpRequest::new(&req, None, &Policy::default());
/// assert_eq!(view.path(), "/v1/items");
/// assert_eq!(view.host(), Some("api.example.com"));
/// assert_eq!(view.header("x-api-key"), Some("k1"));
/// assert_eq!(view.query("tenant").as_deref(), Some("acme"));
/// assert!(view.claim("sub").is_none());
/// ```
pub struct HttpRequest<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a str,
    host: Option<&'a str>,
    headers: &'a HeaderMap,
    ip: Option<IpAddr>,
}

impl<'a> HttpRequest<'a> {
    /// Views `req`, whose socket peer is `peer`: the client address is the
    /// peer unless the peer is one of the policy's trusted proxies.
    pub fn new<B>(req: &'a http::Request<B>, peer: Option<IpAddr>, policy: &Policy) -> Self {
        let headers = req.headers();
        let ip = peer.map(|p| {
            let proxies = policy.trusted_proxies();
            if !proxies.contains(p) {
                // The common case, without reading any header.
                return p.to_canonical();
            }
            let forwarded = forwarding(headers, &FORWARDED);
            let x_forwarded_for = forwarding(headers, &X_FORWARDED_FOR);
            proxies.client_ip(
                p,
                forwarded.iter().map(AsRef::as_ref),
                x_forwarded_for.iter().map(AsRef::as_ref),
            )
        });
        let uri = req.uri();
        HttpRequest {
            method: req.method().as_str(),
            path: uri.path(),
            query: uri.query().unwrap_or(""),
            host: uri
                .host()
                .or_else(|| headers.get(HOST).and_then(|h| h.to_str().ok()))
                .map(strip_port),
            headers,
            ip,
        }
    }
}

const X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");

/// Every value of a forwarding header, as text. A byte that is not text
/// becomes U+FFFD and spoils only the hop it is in: dropping the whole line
/// instead would let a client hide the entry a trusted proxy appended to
/// it, by sending one bad byte ahead of it.
fn forwarding<'h>(headers: &'h HeaderMap, name: &http::HeaderName) -> Vec<Cow<'h, str>> {
    headers
        .get_all(name)
        .into_iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()))
        .collect()
}

/// `host:port` → `host`, leaving bracketed IPv6 literals whole.
fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((h, port)) if !h.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            if h.starts_with('[') || !h.contains(':') {
                h
            } else {
                host
            }
        }
        _ => host,
    }
}

impl Request for HttpRequest<'_> {
    fn ip(&self) -> Option<IpAddr> {
        self.ip
    }

    fn method(&self) -> &str {
        self.method
    }

    fn path(&self) -> &str {
        self.path
    }

    fn host(&self) -> Option<&str> {
        self.host
    }

    fn header(&self, lowercase_name: &str) -> Option<&str> {
        self.headers.get(lowercase_name)?.to_str().ok()
    }

    fn query(&self, name: &str) -> Option<Cow<'_, str>> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::strip_port;

    #[test]
    fn ports_come_off_hosts_but_not_off_addresses() {
        assert_eq!(strip_port("api.example.com:8080"), "api.example.com");
        assert_eq!(strip_port("api.example.com"), "api.example.com");
        assert_eq!(strip_port("[::1]:8080"), "[::1]");
        assert_eq!(strip_port("::1"), "::1");
        // An empty port is allowed by RFC 3986, and means no port.
        assert_eq!(strip_port("host:"), "host");
    }
}
