//! What rules look at in a request: the [`Request`] trait that the middleware,
//! proxy and replay tool implement, and [`RequestParts`], a plain owned one.

use std::borrow::Cow;
use std::net::IpAddr;

/// The parts of an HTTP request that rules match on and build keys from.
///
/// ```
/// use std::borrow::Cow;
/// use std::net::IpAddr;
/// use sluice_policy::Request;
///
/// struct Health;
/// impl Request for Health {
///     fn ip(&self) -> Option<IpAddr> { None }
///     fn method(&self) -> &str { "GET" }
///     fn path(&self) -> &str { "/health" }
///     fn host(&self) -> Option<&str> { None }
///     fn header(&self, _lowercase_name: &str) -> Option<&str> { None }
///     fn query(&self, _name: &str) -> Option<Cow<'_, str>> { None }
/// }
/// assert_eq!(Health.path(), "/health");
/// ```
pub trait Request {
    /// The client address, once trusted proxies have been accounted for.
    fn ip(&self) -> Option<IpAddr>;
    /// The method, as sent (`GET`, `POST`, ...).
    fn method(&self) -> &str;
    /// The path, without the query string, as sent.
    fn path(&self) -> &str;
    /// The host the request was sent to (`:authority` or the `Host` header).
    fn host(&self) -> Option<&str>;
    /// The first value of a header; callers pass the name in lowercase.
    /// Implementations return `None` for values that are not valid UTF-8.
    fn header(&self, lowercase_name: &str) -> Option<&str>;
    /// The first value of a query parameter, percent-decoded.
    fn query(&self, name: &str) -> Option<Cow<'_, str>>;
    /// A claim of the request's JSON Web Token, as text; implementations
    /// return claims only from a token whose signature they verified.
    /// Requests without a verified token have none, the default.
    fn claim(&self, _name: &str) -> Option<Cow<'_, str>> {
        None
    }
    /// The value of an Envoy rate-limit descriptor entry; only requests that
    /// come from Envoy have any, the default being none.
    fn descriptor(&self, _key: &str) -> Option<&str> {
        None
    }
}

/// An owned request, as the replay tool reads it from an event.
///
/// ```
/// use sluice_policy::{Request, RequestParts};
/// let req = RequestParts::new("GET", "/api/items")
///     .with_ip("203.0.113.9".parse().unwrap())
///     .with_header("X-Api-Key", "k1")
///     .with_query("tenant=acme%20corp&page=2");
/// assert_eq!(req.header("x-api-key"), Some("k1"));
/// assert_eq!(req.query("tenant").as_deref(), Some("acme corp"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestParts {
    /// The client address.
    pub ip: Option<IpAddr>,
    /// The method.
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The host; when absent, the `host` header is used.
    pub host: Option<String>,
    /// Headers in any case; lookups ignore case.
    pub headers: Vec<(String, String)>,
    /// The raw query string (`a=1&b=2`; a leading `?` is ignored), decoded
    /// when looked up.
    pub query: String,
    /// Claims of a token already verified. Policy matching reads them;
    /// the engine does not, and reads only a token it verifies itself.
    pub claims: Vec<(String, String)>,
    /// Envoy descriptor entries.
    pub descriptors: Vec<(String, String)>,
}

impl RequestParts {
    /// A request with a method and a path and nothing else.
    ///
    /// ```
    /// use sluice_policy::{Request, RequestParts};
    /// let req = RequestParts::new("POST", "/send");
    /// assert_eq!((req.method(), req.path(), req.ip()), ("POST", "/send", None));
    /// ```
    pub fn new(method: impl Into<String>, path: impl Into<String>) -> Self {
        RequestParts {
            method: method.into(),
            path: path.into(),
            ..Self::default()
        }
    }

    /// Sets the client address.
    ///
    /// ```
    /// use sluice_policy::{Request, RequestParts};
    /// let req = RequestParts::new("GET", "/").with_ip([192, 0, 2, 1].into());
    /// assert_eq!(req.ip(), Some([192, 0, 2, 1].into()));
    /// ```
    pub fn with_ip(self, ip: IpAddr) -> Self {
        RequestParts {
            ip: Some(ip),
            ..self
        }
    }

    /// Sets the host.
    ///
    /// ```
    /// use sluice_policy::{Request, RequestParts};
    /// let req = RequestParts::new("GET", "/").with_host("api.example.com");
    /// assert_eq!(req.host(), Some("api.example.com"));
    /// ```
    pub fn with_host(self, host: impl Into<String>) -> Self {
        RequestParts {
            host: Some(host.into()),
            ..self
        }
    }

    /// Adds a header.
    ///
    /// ```
    /// use sluice_policy::{Request, RequestParts};
    /// let req = RequestParts::new("GET", "/").with_header("Host", "example.com");
    /// assert_eq!(req.host(), Some("example.com"));
    /// ```
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Adds a claim of a verified token.
    ///
    /// ```
    /// use sluice_policy::{Request, RequestParts};
    /// let req = RequestParts::new("GET", "/").with_claim("sub", "user-1");
    /// assert_eq!(req.claim("sub").as_deref(), Some("user-1"));
    /// ```
    pub fn with_claim(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.claims.push((name.into(), value.into()));
        self
    }

    /// Adds an Envoy descriptor entry.
    ///
    /// ```
    /// use sluice_policy::{Request, RequestParts};
    /// let req = RequestParts::new("", "").with_descriptor("remote_address", "10.0.0.1");
    /// assert_eq!(req.descriptor("remote_address"), Some("10.0.0.1"));
    /// ```
    pub fn with_descriptor(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.descriptors.push((key.into(), value.into()));
        self
    }

    /// Takes `ip` as the socket peer and puts the client address in its
    /// place: the peer itself, unless it is one of `proxies`, whose
    /// forwarding headers among `headers` then say who the client is (see
    /// [`TrustedProxies::client_ip`](crate::TrustedProxies::client_ip)), as
    /// the middleware decides a live request.
    ///
    /// ```
    /// use sluice_policy::{Request, RequestParts, TrustedProxies};
    /// let proxies = TrustedProxies::parse(&["10.0.0.0/8"]).unwrap();
    /// let via_proxy = RequestParts::new("GET", "/")
    ///     .with_ip("10.0.0.1".parse().unwrap())
    ///     .with_header("X-Forwarded-For", "192.0.2.9")
    ///     .with_client_behind(&proxies);
    /// assert_eq!(via_proxy.ip(), Some("192.0.2.9".parse().unwrap()));
    /// let forged = RequestParts::new("GET", "/")
    ///     .with_ip("203.0.113.1".parse().unwrap())
    ///     .with_header("X-Forwarded-For", "192.0.2.9")
    ///     .with_client_behind(&proxies);
    /// assert_eq!(forged.ip(), Some("203.0.113.1".parse().unwrap()));
    /// ```
    pub fn with_client_behind(mut self, proxies: &crate::TrustedProxies) -> Self {
        if let Some(peer) = self.ip {
            let values = |name: &'static str| {
                self.headers
                    .iter()
                    .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.as_str())
            };
            self.ip = Some(proxies.client_ip(peer, values("forwarded"), values("x-forwarded-for")));
        }
        self
    }

    /// Sets the raw query string.
    ///
    /// ```
    /// use sluice_policy::{Request, RequestParts};
    /// let req = RequestParts::new("GET", "/").with_query("q=a+b&flag");
    /// assert_eq!(req.query("q").as_deref(), Some("a b"));
    /// assert_eq!(req.query("flag").as_deref(), Some(""));
    /// ```
    pub fn with_query(self, query: impl Into<String>) -> Self {
        RequestParts {
            query: query.into(),
            ..self
        }
    }
}

impl Request for RequestParts {
    fn ip(&self) -> Option<IpAddr> {
        self.ip
    }

    fn method(&self) -> &str {
        &self.method
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn host(&self) -> Option<&str> {
        self.host.as_deref().or_else(|| self.header("host"))
    }

    fn header(&self, lowercase_name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(lowercase_name))
            .map(|(_, v)| v.as_str())
    }

    fn query(&self, name: &str) -> Option<Cow<'_, str>> {
        let query = self.query.strip_prefix('?').unwrap_or(&self.query);
        form_urlencoded::parse(query.as_bytes())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    fn claim(&self, name: &str) -> Option<Cow<'_, str>> {
        lookup(&self.claims, name).map(Cow::Borrowed)
    }

    fn descriptor(&self, key: &str) -> Option<&str> {
        lookup(&self.descriptors, key)
    }
}

fn lookup<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}
