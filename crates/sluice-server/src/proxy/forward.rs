//! The forwarding half of the proxy: a tower service that sends each
//! request on to the upstream over kept-alive connections (see [`super::pool`])
//! and streams the answer back, rewriting only what a proxy must (hop-by-hop
//! headers, `Host`, `X-Forwarded-*`) and answering 502/504 itself when the
//! upstream fails.

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{
    CONNECTION, CONTENT_TYPE, COOKIE, FORWARDED, HOST, HeaderName, HeaderValue, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use sluice_core::Store;
use sluice_engine::Enforcer;
use sluice_http::{PROBLEM_JSON, PeerAddr, PolicySnapshot, Problem};

use super::Upstream;
use super::body::{BodyStalled, SentBody};
use super::pool::{Lane, Pool, Reusing, SendError};

/// The body of a proxied response: the upstream's, streamed, or one the
/// proxy wrote (a 502 or 504).
pub(crate) type ProxyBody = Either<Reusing, Full<Bytes>>;

// Statics, not constants: a header map takes a name that is not one of
// the standard ones for less by `'static` reference than as an owned copy.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// A request rewritten for the upstream, with what its answer needs.
struct Prepared {
    out: Request<SentBody>,
    /// Resolves once the request body has all been sent.
    sent: tokio::sync::oneshot::Receiver<()>,
    /// The client's side of a protocol switch it asked for.
    client_upgrade: Option<OnUpgrade>,
}

/// Sends requests to the upstream. Cheap to clone, as the tower idiom
/// does once or twice a request: clones share one [`Shared`].
pub(crate) struct Forward<S> {
    shared: Arc<Shared<S>>,
    /// The client connection's upstream lane (see [`Forward::for_connection`]);
    /// without one, each request gets a lane of its own.
    lane: Option<Arc<Lane>>,
}

/// What every request's forwarding reads.
struct Shared<S> {
    pool: Arc<Pool>,
    /// `sluice_proxy_upstream_seconds`, looked up once rather than per
    /// request (the recorder is installed before the proxy starts).
    upstream_seconds: ::metrics::Histogram,
    upstream: Upstream,
    /// For the policy's trusted proxies, whose `X-Forwarded-*` are kept.
    enforcer: Arc<Enforcer<S>>,
}

impl<S> Clone for Forward<S> {
    fn clone(&self) -> Self {
        Forward {
            shared: Arc::clone(&self.shared),
            lane: self.lane.clone(),
        }
    }
}

impl<S: Store + 'static> Forward<S> {
    /// A forwarder to `upstream`, with its own connection pool.
    pub(crate) fn new(upstream: Upstream, enforcer: Arc<Enforcer<S>>) -> Self {
        Forward {
            shared: Arc::new(Shared {
                pool: Pool::new(upstream.origin(), upstream.timeout()),
                upstream_seconds: ::metrics::histogram!("sluice_proxy_upstream_seconds"),
                upstream,
                enforcer,
            }),
            lane: None,
        }
    }

    /// A forwarder for one client connection: its requests go over the
    /// upstream connection the previous one used, while it is free.
    pub(crate) fn for_connection(&self) -> Self {
        Forward {
            shared: Arc::clone(&self.shared),
            lane: Some(Lane::new(Arc::clone(&self.shared.pool))),
        }
    }

    /// Rewrites `req` for the upstream, or answers it here when it cannot be
    /// forwarded. Apart from [`Forward::send`] so that what the rewriting
    /// needs is not carried through the wait for the upstream.
    fn prepare(&self, req: Request<Incoming>) -> Result<Prepared, Box<Response<ProxyBody>>> {
        if req.method() == Method::CONNECT {
            return Err(Box::new(problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "CONNECT is not supported: this is a reverse proxy",
            )));
        }
        let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        let (mut parts, body) = req.into_parts();
        // A protocol switch (WebSocket) is asked for with hop-by-hop headers,
        // so it is passed on explicitly; HTTP/2 has no such upgrade.
        let upgrade = upgrade_requested(parts.version, &parts.headers);
        let client_upgrade = upgrade
            .as_ref()
            .and_then(|_| parts.extensions.remove::<OnUpgrade>());
        let Ok(uri) = self.shared.upstream.target_for(&parts.uri) else {
            return Err(Box::new(problem(
                StatusCode::BAD_REQUEST,
                "the request target cannot be forwarded",
            )));
        };
        let mut headers = parts.headers;
        // The host the rules matched: the target's authority when it has one
        // (an absolute-form HTTP/1.1 target, whose `Host` a server must
        // ignore, RFC 9112 §3.2.2; or HTTP/2's `:authority`), else `Host`.
        // The upstream gets the same in `Host`, so that a client cannot be
        // counted under one host and served by another.
        let host = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .or_else(|| headers.get(HOST).cloned());
        strip_hop_by_hop(&mut headers);
        if parts.version == Version::HTTP_2 {
            join_cookies(&mut headers);
        }
        match &host {
            Some(h) => headers.insert(HOST, h.clone()),
            // An HTTP/1.0 request may have no `Host`; HTTP/1.1 needs one.
            None => headers.insert(
                HOST,
                HeaderValue::from_str(self.shared.upstream.authority().as_str())
                    .unwrap_or(HeaderValue::from_static("localhost")),
            ),
        };
        if let Some(protocol) = upgrade {
            headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(UPGRADE, protocol);
        }
        // The policy the request was decided by; a reload since then does
        // not change whose forwarding headers are believed.
        let policy = match parts.extensions.remove::<PolicySnapshot>() {
            Some(PolicySnapshot(policy)) => policy,
            None => self.shared.enforcer.policy(),
        };
        let trusted = peer.is_some_and(|p| policy.trusted_proxies().contains(p));
        add_forwarded(&mut headers, peer, host.as_ref(), trusted);

        let (body, sent) = SentBody::new(body, self.shared.upstream.body_timeout());
        let mut out = Request::new(body);
        *out.method_mut() = parts.method;
        *out.uri_mut() = uri;
        // Whatever the client spoke, the upstream hears HTTP/1.1, the
        // version with keep-alive by default.
        *out.version_mut() = Version::HTTP_11;
        *out.headers_mut() = headers;
        Ok(Prepared {
            out,
            sent,
            client_upgrade,
        })
    }

    /// Sends a prepared request and turns what comes back into the client's
    /// response.
    async fn send(self, prepared: Prepared) -> Response<ProxyBody> {
        let Prepared {
            out,
            sent,
            client_upgrade,
        } = prepared;
        // The client connection's lane, or one for this request alone.
        let lane = match &self.lane {
            Some(lane) => Arc::clone(lane),
            None => Lane::new(Arc::clone(&self.shared.pool)),
        };
        let timeout = self.shared.upstream.timeout();
        let timer = Arc::clone(lane.timer());
        let deadline = async move {
            // Resolves when the body is done or dropped; either way the
            // upstream has all it will get, and the clock starts.
            let _ = sent.await;
            timer.sleep(timeout).await;
        };
        let started = Instant::now();
        let result = tokio::select! {
            r = lane.send(out) => Some(r),
            () = deadline => None,
        };
        self.shared
            .upstream_seconds
            .record(started.elapsed().as_secs_f64());
        match result {
            Some(Ok(mut res)) if res.status() == StatusCode::SWITCHING_PROTOCOLS => {
                let Some(client) = client_upgrade else {
                    upstream_error_message(
                        "protocol",
                        "a 101 response to a request without Upgrade",
                    );
                    return problem(
                        StatusCode::BAD_GATEWAY,
                        "the upstream switched protocols unasked",
                    );
                };
                let upstream = hyper::upgrade::on(&mut res);
                let (mut parts, _) = res.into_parts();
                let protocol = parts.headers.get(UPGRADE).cloned();
                strip_hop_by_hop(&mut parts.headers);
                parts
                    .headers
                    .insert(CONNECTION, HeaderValue::from_static("upgrade"));
                if let Some(p) = protocol {
                    parts.headers.insert(UPGRADE, p);
                }
                tokio::spawn(tunnel(client, upstream));
                Response::from_parts(parts, Either::Right(Full::new(Bytes::new())))
            }
            Some(Ok(res)) => {
                let (mut parts, body) = res.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, Either::Left(body))
            }
            Some(Err(e)) if e.is_connect() && timed_out(&e) => {
                upstream_error("timeout", &e);
                problem(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the upstream did not accept a connection in time",
                )
            }
            Some(Err(e)) if e.is_connect() => {
                upstream_error("connect", &e);
                problem(StatusCode::BAD_GATEWAY, "the upstream could not be reached")
            }
            Some(Err(e)) if stalled(&e) => {
                ::metrics::counter!("sluice_proxy_body_timeouts_total").increment(1);
                tracing::debug!(error = %chain(&e), "request body stalled");
                problem(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request body stopped arriving for longer than the proxy waits",
                )
            }
            Some(Err(e)) => {
                upstream_error("protocol", &e);
                problem(
                    StatusCode::BAD_GATEWAY,
                    "the upstream closed the connection or sent an invalid response",
                )
            }
            None => {
                ::metrics::counter!("sluice_proxy_upstream_errors_total", "kind" => "timeout")
                    .increment(1);
                tracing::warn!(upstream = %self.shared.upstream, ?timeout, "upstream timed out");
                problem(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the upstream did not answer in time",
                )
            }
        }
    }
}

impl<S: Store + 'static> tower::Service<Request<Incoming>> for Forward<S> {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The pool has no limit to wait for.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        // Rewritten here, so that the future holds only what the wait for
        // the upstream needs.
        match self.prepare(req) {
            Ok(prepared) => {
                let this = self.clone();
                Box::pin(async move { Ok(this.send(prepared).await) })
            }
            Err(answer) => Box::pin(std::future::ready(Ok(*answer))),
        }
    }
}

fn upstream_error(kind: &'static str, e: &SendError) {
    upstream_error_message(kind, &chain(e));
}

fn upstream_error_message(kind: &'static str, error: &str) {
    ::metrics::counter!("sluice_proxy_upstream_errors_total", "kind" => kind).increment(1);
    tracing::warn!(error, "upstream request failed");
}

/// The protocol an HTTP/1.1 request asks to switch to: it names `upgrade`
/// in `Connection` and says which protocol in `Upgrade` (RFC 9110 §7.8).
fn upgrade_requested(version: Version, headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = version == Version::HTTP_11
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(UPGRADE).cloned()).flatten()
}

/// Once both sides have switched protocols, copies bytes between them
/// until either closes. The tunnel outlives the request, so it is counted
/// while it is open.
async fn tunnel(client: OnUpgrade, upstream: OnUpgrade) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(error = %e, "protocol switch failed");
            return;
        }
    };
    let open = ::metrics::gauge!("sluice_proxy_tunnels_open");
    open.increment(1.0);
    let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
        tracing::debug!(error = %e, "tunnel closed with an error");
    }
    open.decrement(1.0);
}

/// An error and its causes on one line: the outermost message alone says
/// little ("cannot connect to the upstream").
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Whether `e` or one of its causes satisfies `is`.
fn caused_by(
    e: &(dyn std::error::Error + 'static),
    is: impl Fn(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    let mut source = Some(e);
    while let Some(s) = source {
        if is(s) {
            return true;
        }
        source = s.source();
    }
    false
}

/// Whether the connector gave up waiting, rather than being refused.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    caused_by(e, |s| {
        s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

/// Whether the request failed because the client's body stalled.
fn stalled(e: &(dyn std::error::Error + 'static)) -> bool {
    caused_by(e, |s| s.is::<BodyStalled>())
}

/// Removes the headers that describe one connection rather than the
/// message (RFC 9110 §7.6.1): `Connection` and every header it names,
/// `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, and
/// `Proxy-*` (plus `Proxy` itself, the httpoxy vector). Body framing is
/// hyper's business on each side, so dropping `Transfer-Encoding` loses
/// nothing.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of these. One pass over the names finds that
    // out for less than the hashing of six removals that would find nothing.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in &named {
        headers.remove(name);
    }
    let fixed: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n))
        .cloned()
        .collect();
    for name in &fixed {
        headers.remove(name);
    }
}

/// Whether `strip_hop_by_hop` removes `name` whatever `Connection` says.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    [
        &CONNECTION,
        &KEEP_ALIVE,
        &TE,
        &TRAILER,
        &TRANSFER_ENCODING,
        &UPGRADE,
    ]
    .contains(&name)
        || name.as_str() == "proxy"
        || name.as_str().starts_with("proxy-")
}

/// HTTP/2 lets a client split `Cookie` into one field per cookie; HTTP/1.1
/// allows one field, so they are joined with `; ` (RFC 9113 §8.2.3).
fn join_cookies(headers: &mut HeaderMap) {
    if headers.get_all(COOKIE).iter().nth(1).is_none() {
        return;
    }
    let joined: Vec<&[u8]> = headers
        .get_all(COOKIE)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if let Ok(v) = HeaderValue::from_bytes(&joined.join(&b"; "[..])) {
        headers.insert(COOKIE, v);
    }
}

/// Appends `ip` as `Display` writes it. Every proxied request writes its
/// peer's address, and an IPv4 one is four numbers: formatting them
/// directly skips the formatting machinery, which cost more than the rest
/// of the header's handling together (callgrind).
fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(digits.format(octet));
            }
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write;
            let _ = write!(out, "{v6}");
        }
    }
}

/// `X-Forwarded-For` gets the peer appended, so its last entry is always
/// the address this proxy saw; so does `Forwarded` when the request has one,
/// so that the two never tell a server behind this proxy different things
/// (and one that reads both cannot be steered by the one a client wrote).
/// `X-Forwarded-Host` and `-Proto` are set from this hop, unless the peer is
/// one of the policy's trusted proxies and already said them (a TLS
/// terminator in front knows the real scheme).
fn add_forwarded(
    headers: &mut HeaderMap,
    peer: Option<IpAddr>,
    host: Option<&HeaderValue>,
    trusted: bool,
) {
    if let Some(ip) = peer {
        let ip = ip.to_canonical();
        if headers.contains_key(FORWARDED) {
            // RFC 7239 §6: an IPv6 node is bracketed, and so quoted.
            let node = match ip {
                IpAddr::V4(v4) => format!("for={v4}"),
                IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
            };
            headers.append(
                FORWARDED,
                HeaderValue::from_str(&node).unwrap_or(HeaderValue::from_static("for=unknown")),
            );
        }
        let mut value = String::with_capacity(16);
        let prior = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty());
        for hop in prior {
            value.push_str(hop);
            value.push_str(", ");
        }
        push_ip(&mut value, ip);
        if let Ok(v) = HeaderValue::try_from(value) {
            headers.insert(&X_FORWARDED_FOR, v);
        }
    }
    if !(trusted && headers.contains_key(&X_FORWARDED_HOST))
        && let Some(h) = host
    {
        headers.insert(&X_FORWARDED_HOST, h.clone());
    }
    if !(trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
        // The proxy listens on plain TCP only.
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
}

/// A problem-details response written by the proxy itself.
pub(crate) fn problem(status: StatusCode, detail: &str) -> Response<ProxyBody> {
    let body = Problem::new(status, detail).to_json();
    let mut res = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *res.status_mut() = status;
    res.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    res
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret"),
            ("connection", "x-other"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic eA=="),
            ("proxy-connection", "keep-alive"),
            ("proxy", "http://evil"),
            ("x-kept", "3"),
            ("authorization", "Bearer t"),
        ]);
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["authorization", "x-kept"]);
        // Each one alone, with no `Connection` to point at it, goes too.
        for name in [
            "connection",
            "keep-alive",
            "te",
            "trailer",
            "upgrade",
            "proxy",
            "proxy-x",
        ] {
            let mut h = map(&[("x-kept", "1"), (name, "v")]);
            strip_hop_by_hop(&mut h);
            let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
            assert_eq!(left, ["x-kept"], "{name}");
        }
        let mut h = map(&[("x-kept", "1"), ("proxyish", "v")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "192.0.2.7",
            "255.255.255.255",
            "10.20.0.1",
            "::1",
            "2001:db8::7",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut out = String::from("x, ");
            push_ip(&mut out, ip);
            assert_eq!(out, format!("x, {ip}"));
        }
    }

    #[test]
    fn the_peer_is_appended_and_untrusted_forwarded_claims_are_replaced() {
        let host = HeaderValue::from_static("api.example");
        let peer = Some("192.0.2.7".parse().unwrap());
        let mut h = map(&[
            ("x-forwarded-for", "203.0.113.1"),
            ("x-forwarded-for", " 10.0.0.1 "),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "https"),
        ]);
        add_forwarded(&mut h, peer, Some(&host), false);
        assert_eq!(h["x-forwarded-for"], "203.0.113.1, 10.0.0.1, 192.0.2.7");
        assert_eq!(h["x-forwarded-host"], "api.example");
        assert_eq!(h["x-forwarded-proto"], "http");

        let mut h = map(&[
            ("x-forwarded-host", "a.example"),
            ("x-forwarded-proto", "https"),
        ]);
        add_forwarded(&mut h, peer, Some(&host), true);
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        assert_eq!(h["x-forwarded-host"], "a.example");
        assert_eq!(h["x-forwarded-proto"], "https");

        // IPv4-mapped peers are written as the IPv4 address they are.
        let mut h = HeaderMap::new();
        add_forwarded(
            &mut h,
            Some("::ffff:192.0.2.9".parse().unwrap()),
            None,
            false,
        );
        assert_eq!(h["x-forwarded-for"], "192.0.2.9");
        assert!(h.get("x-forwarded-host").is_none());
        // No Forwarded is added to a request without one...
        assert!(h.get(FORWARDED).is_none());

        // ...but one the client sent gets this hop too, IPv6 quoted.
        let mut h = map(&[("forwarded", "for=198.51.100.1")]);
        add_forwarded(&mut h, Some("2001:db8::7".parse().unwrap()), None, false);
        let forwarded: Vec<&str> = h
            .get_all(FORWARDED)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(forwarded, ["for=198.51.100.1", r#"for="[2001:db8::7]""#]);
        assert_eq!(h["x-forwarded-for"], "2001:db8::7");
    }

    #[test]
    fn split_cookies_are_joined() {
        let mut h = map(&[("cookie", "a=1"), ("cookie", "b=2")]);
        join_cookies(&mut h);
        assert_eq!(h.get_all(COOKIE).iter().count(), 1);
        assert_eq!(h[COOKIE], "a=1; b=2");
    }

    #[test]
    fn problems_are_problem_json() {
        let res = problem(StatusCode::BAD_GATEWAY, "down");
        assert_eq!(res.status(), 502);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
    }
}
