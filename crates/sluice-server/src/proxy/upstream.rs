//! Where `sluice proxy` sends admitted requests: an `http://` origin,
//! optionally with a base path, and how long it may take to answer.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::Uri;
use http::uri::{Authority, PathAndQuery, Scheme};

/// How long the upstream has, by default, to start its response once the
/// request has been sent (see [`Upstream::with_timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long, by default, a client may pause while sending a request body
/// (see [`Upstream::with_body_timeout`]).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// The upstream of a proxy: `http://host:port`, optionally followed by a
/// base path that every forwarded path is appended to.
///
/// ```
/// use sluice_server::proxy::Upstream;
/// let up: Upstream = "http://127.0.0.1:9000/api/".parse().unwrap();
/// assert_eq!(up.to_string(), "http://127.0.0.1:9000/api");
/// assert_eq!(up.timeout(), sluice_server::proxy::DEFAULT_TIMEOUT);
/// assert!("https://example.com".parse::<Upstream>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    authority: Authority,
    /// The base path without its trailing slash: empty, or `/seg/...`.
    base: String,
    timeout: Duration,
    body_timeout: Duration,
}

/// Why an upstream URL was refused.
///
/// ```
/// use sluice_server::proxy::{Upstream, UpstreamError};
/// let err = Upstream::parse("ftp://example.com").unwrap_err();
/// assert!(matches!(err, UpstreamError::Scheme { .. }));
/// assert!(err.to_string().contains("http://"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamError {
    /// Not a URL at all.
    Invalid {
        /// The URL as given.
        url: String,
        /// What the parser said.
        reason: String,
    },
    /// A scheme other than `http` (or none).
    Scheme {
        /// The URL as given.
        url: String,
    },
    /// No host, or credentials in the URL.
    Authority {
        /// The URL as given.
        url: String,
    },
    /// A query string, which forwarded requests bring their own of.
    Query {
        /// The URL as given.
        url: String,
    },
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Invalid { url, reason } => {
                write!(f, "upstream {url:?} is not a URL: {reason}")
            }
            UpstreamError::Scheme { url } => write!(
                f,
                "upstream {url:?}: only http:// upstreams are supported (terminate TLS in front of \
                 the upstream, or run it on plain HTTP on a private network)"
            ),
            UpstreamError::Authority { url } => write!(
                f,
                "upstream {url:?} must name a host (and optionally a port), without credentials"
            ),
            UpstreamError::Query { url } => write!(
                f,
                "upstream {url:?} must not have a query string; requests keep their own"
            ),
        }
    }
}

impl std::error::Error for UpstreamError {}

impl Upstream {
    /// Parses `http://host[:port][/base/path]`.
    ///
    /// ```
    /// use sluice_server::proxy::Upstream;
    /// assert!(Upstream::parse("http://localhost:8080").is_ok());
    /// assert!(Upstream::parse("http://[::1]:8080/v2").is_ok());
    /// assert!(Upstream::parse("localhost:8080").is_err());
    /// assert!(Upstream::parse("http://user:pw@localhost").is_err());
    /// assert!(Upstream::parse("http://localhost/?a=b").is_err());
    /// ```
    pub fn parse(url: &str) -> Result<Upstream, UpstreamError> {
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| UpstreamError::Invalid {
                url: url.to_owned(),
                reason: e.to_string(),
            })?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(UpstreamError::Scheme {
                url: url.to_owned(),
            });
        }
        let authority = match uri.authority() {
            Some(a) if !a.host().is_empty() && !a.as_str().contains('@') => a.clone(),
            _ => {
                return Err(UpstreamError::Authority {
                    url: url.to_owned(),
                });
            }
        };
        if uri.query().is_some() {
            return Err(UpstreamError::Query {
                url: url.to_owned(),
            });
        }
        Ok(Upstream {
            authority,
            base: uri.path().trim_end_matches('/').to_owned(),
            timeout: DEFAULT_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
        })
    }

    /// The same upstream, given `timeout` to start each response: the time
    /// from the last byte of the request body being sent (or from
    /// connecting, for a request without a body) until the response headers
    /// arrive. Past it the client gets a 504.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_server::proxy::Upstream;
    /// let up = Upstream::parse("http://localhost:80").unwrap().with_timeout(Duration::from_secs(5));
    /// assert_eq!(up.timeout(), Duration::from_secs(5));
    /// ```
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Upstream {
        self.timeout = timeout;
        self
    }

    /// How long the upstream has to start a response.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same upstream, with requests whose body stalls for `timeout`
    /// (no data from the client for that long) abandoned: the client gets a
    /// 408, and the upstream connection, which is mid-request, is closed.
    /// Without it a client could hold an upstream connection open for as
    /// long as it liked by sending a body slowly.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_server::proxy::{DEFAULT_BODY_TIMEOUT, Upstream};
    /// let up = Upstream::parse("http://localhost:80").unwrap();
    /// assert_eq!(up.body_timeout(), DEFAULT_BODY_TIMEOUT);
    /// let up = up.with_body_timeout(Duration::from_secs(5));
    /// assert_eq!(up.body_timeout(), Duration::from_secs(5));
    /// ```
    #[must_use]
    pub fn with_body_timeout(mut self, timeout: Duration) -> Upstream {
        self.body_timeout = timeout;
        self
    }

    /// How long a client may pause while sending a request body.
    pub fn body_timeout(&self) -> Duration {
        self.body_timeout
    }

    /// The origin-form target (path and query) that a request whose target
    /// was `original` has upstream: the base path, then the request's own
    /// path and query. An `OPTIONS *` target (no leading slash) becomes the
    /// base path itself, or `/`.
    pub(crate) fn target_for(&self, original: &Uri) -> Result<Uri, http::Error> {
        let target = original.path_and_query().map_or("/", PathAndQuery::as_str);
        let path = if target.starts_with('/') {
            if self.base.is_empty()
                && let Some(same) = original.path_and_query()
            {
                return Ok(Uri::from(same.clone()));
            }
            format!("{}{target}", self.base)
        } else if self.base.is_empty() {
            "/".to_owned()
        } else {
            self.base.clone()
        };
        Ok(Uri::from(PathAndQuery::try_from(path)?))
    }

    /// `http://host:port`: where connections go.
    pub(crate) fn origin(&self) -> Uri {
        Uri::from_parts({
            let mut parts = http::uri::Parts::default();
            parts.scheme = Some(Scheme::HTTP);
            parts.authority = Some(self.authority.clone());
            parts.path_and_query = Some(PathAndQuery::from_static("/"));
            parts
        })
        .unwrap_or_default()
    }

    /// The upstream's `host:port`, its `Host` for a request without one.
    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }
}

impl FromStr for Upstream {
    type Err = UpstreamError;

    fn from_str(s: &str) -> Result<Upstream, UpstreamError> {
        Upstream::parse(s)
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.base)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn join(upstream: &str, target: &str) -> String {
        let up = Upstream::parse(upstream).unwrap();
        up.target_for(&target.parse().unwrap()).unwrap().to_string()
    }

    #[test]
    fn paths_join_under_the_base_with_one_slash() {
        assert_eq!(join("http://u:1", "/a?b=c"), "/a?b=c");
        assert_eq!(join("http://u:1/", "/a"), "/a");
        assert_eq!(join("http://u:1/base", "/a?x"), "/base/a?x");
        assert_eq!(join("http://u:1/base/", "/"), "/base/");
        // Absolute-form targets keep only their path and query.
        assert_eq!(join("http://u:1/b", "http://other/x?y"), "/b/x?y");
        assert_eq!(join("http://u:1/b", "*"), "/b");
        assert_eq!(join("http://u:1", "*"), "/");
    }

    #[test]
    fn connections_go_to_the_origin() {
        let up = Upstream::parse("http://[::1]:8080/api").unwrap();
        assert_eq!(up.origin().to_string(), "http://[::1]:8080/");
        assert_eq!(up.authority().as_str(), "[::1]:8080");
    }

    #[test]
    fn only_plain_http_origins_are_accepted() {
        for bad in [
            "https://x",
            "x:80",
            "/path",
            "http://",
            "http://a@b",
            "http://x/?q",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Upstream::parse("http://[::1]:80/a/b/").unwrap().to_string(),
            "http://[::1]:80/a/b"
        );
    }
}
