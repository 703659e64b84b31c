//! A request seen with the claims of its verified token, and no others.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::OnceLock;

use sluice_policy::{Claims, Policy, Request};

/// Any request with the claims of its verified token: the header the
/// policy's `jwt` section names is read from `inner`, and `claim` answers
/// only from a token that passes verification. The token is verified on the
/// first `claim`, so requests that no `jwt:` rule looks at pay nothing.
///
/// ```
/// use sluice_engine::Verified;
/// use sluice_policy::{Policy, Request, RequestParts};
/// let req = RequestParts::new("GET", "/").with_header("authorization", "Bearer not.a.jwt");
/// let policy = Policy::default();
/// let view = Verified::new(&req, &policy);
/// assert_eq!(view.path(), "/");
/// assert!(view.claim("sub").is_none());
/// ```
pub struct Verified<'a, R: ?Sized> {
    inner: &'a R,
    policy: &'a Policy,
    claims: OnceLock<Option<Claims>>,
}

impl<'a, R: Request + ?Sized> Verified<'a, R> {
    /// `inner`, whose token the policy's keys will verify when asked.
    pub fn new(inner: &'a R, policy: &'a Policy) -> Self {
        Verified {
            inner,
            policy,
            claims: OnceLock::new(),
        }
    }

    fn claims(&self) -> Option<&Claims> {
        self.claims
            .get_or_init(|| {
                let jwt = self.policy.jwt()?;
                let value = self.inner.header(jwt.header())?;
                jwt.verify(jwt.token_from_header(value)?)
            })
            .as_ref()
    }
}

impl<R: Request + ?Sized> Request for Verified<'_, R> {
    fn ip(&self) -> Option<IpAddr> {
        self.inner.ip()
    }

    fn method(&self) -> &str {
        self.inner.method()
    }

    fn path(&self) -> &str {
        self.inner.path()
    }

    fn host(&self) -> Option<&str> {
        self.inner.host()
    }

    fn header(&self, lowercase_name: &str) -> Option<&str> {
        self.inner.header(lowercase_name)
    }

    fn query(&self, name: &str) -> Option<Cow<'_, str>> {
        self.inner.query(name)
    }

    fn claim(&self, name: &str) -> Option<Cow<'_, str>> {
        self.claims()?.get(name)
    }

    fn descriptor(&self, key: &str) -> Option<&str> {
        self.inner.descriptor(key)
    }
}
