use std::sync::Arc;

use axum::body::Body;
use http::{HeaderValue, Method, Request, StatusCode, header};
use serde_json::Value;
use sluice_core::FakeClock;
use sluice_server::serve::{AnyStore, ServerState};
use tower::ServiceExt;

use crate::api::{ENDPOINTS, query};
use crate::service::{ADMIN_TOKEN, API_TOKEN, block_on, state_with};

/// The most calls one input makes: enough for a lease to be taken, used
/// and released, a limit brought and then named, a key spent and refunded.
const MAX_CALLS: usize = 16;

/// The `Authorization` a call carries: `c % 4` of its caller byte `c`.
#[derive(Clone, Copy, PartialEq)]
enum Auth {
    None,
    Api,
    Admin,
    Wrong,
}

/// The body's `Content-Type`: `(c / 4) % 4`.
#[derive(Clone, Copy, PartialEq)]
enum Type {
    Json,
    TextPlain,
    Untyped,
    JsonWithCharset,
}

/// What a browser says of the page that sent the call: `(c / 16) % 4`.
#[derive(Clone, Copy, PartialEq)]
enum Page {
    /// None: a service, a load balancer, curl.
    None,
    /// `Origin` of another site.
    Foreign,
    /// `Sec-Fetch-Site: cross-site`.
    CrossSite,
    /// A page on a name of its own pointed at the server (DNS rebinding):
    /// `Host` that name and `Origin` the same.
    Rebound,
}

/// Who sends a call, from its caller byte less `'0'`.
#[derive(Clone, Copy)]
struct Caller {
    auth: Auth,
    body: Type,
    page: Page,
}

impl Caller {
    fn of(byte: u8) -> Caller {
        let c = byte.wrapping_sub(b'0');
        Caller {
            auth: [Auth::None, Auth::Api, Auth::Admin, Auth::Wrong][usize::from(c % 4)],
            body: [
                Type::Json,
                Type::TextPlain,
                Type::Untyped,
                Type::JsonWithCharset,
            ][usize::from(c / 4 % 4)],
            page: [Page::None, Page::Foreign, Page::CrossSite, Page::Rebound]
                [usize::from(c / 16 % 4)],
        }
    }

    /// Whether the call carries a token the server takes: the API token,
    /// when the server has one (`api_token`), or the admin token, which
    /// does whatever it does.
    fn has_token(self, api_token: bool) -> bool {
        self.auth == Auth::Admin || (api_token && self.auth == Auth::Api)
    }

    /// The request for `method` and `uri` with `body`, with this caller's
    /// headers.
    fn request(self, method: &Method, uri: &str, body: Vec<u8>) -> Request<Body> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(header::HOST, "127.0.0.1:8080");
        match self.auth {
            Auth::None => {}
            Auth::Api => req = req.header(header::AUTHORIZATION, format!("Bearer {API_TOKEN}")),
            Auth::Admin => {
                req = req.header(header::AUTHORIZATION, format!("Bearer {ADMIN_TOKEN}"));
            }
            Auth::Wrong => req = req.header(header::AUTHORIZATION, "Bearer not-the-token"),
        }
        if method == Method::POST {
            match self.body {
                Type::Json => req = req.header(header::CONTENT_TYPE, "application/json"),
                Type::TextPlain => req = req.header(header::CONTENT_TYPE, "text/plain"),
                Type::Untyped => {}
                Type::JsonWithCharset => {
                    req = req.header(header::CONTENT_TYPE, "application/json; charset=utf-8");
                }
            }
        }
        match self.page {
            Page::None => {}
            Page::Foreign => req = req.header(header::ORIGIN, "https://evil.example"),
            Page::CrossSite => req = req.header("sec-fetch-site", "cross-site"),
            Page::Rebound => {
                let headers = req.headers_mut().expect("a well-formed request");
                headers.insert(header::HOST, HeaderValue::from_static("evil.example:8080"));
                headers.insert(
                    header::ORIGIN,
                    HeaderValue::from_static("http://evil.example:8080"),
                );
            }
        }
        req.body(Body::from(body))
            .expect("the request is well formed")
    }
}

/// Sends a sequence of calls to the decision API of `sluice serve`
/// ([`sluice_server::serve::app`]), in process, over the fuzzing policy and an
/// empty in-memory store, on a server with an admin token and an API token
/// (or, when the input begins with `!`, none: then only the rules on pages
/// and bodies stand between a web page and the privileged calls): the
/// privileged fields (`force`, `reserve`, inline limits), refunds and
/// leases, from callers of every kind.
///
/// Each line of the input is a call: an endpoint byte as [`api`](crate::api)
/// takes it (`0` `/v1/limit`, `1` `/v1/check`, `2` `/v1/reset`, `3`
/// `/v1/enforce`, `4` `/v1/value`, `5` `/v1/refund`, `6` `/v1/acquire`, `7`
/// `/v1/release`), a caller byte `c` (less `'0'`: `c % 4` the token, none,
/// the API's, the admin's or a wrong one; `c / 4 % 4` the content type,
/// JSON, `text/plain`, none or JSON with a charset; `c / 16 % 4` the page,
/// none, another origin, a cross-site fetch or a rebound name), and the
/// body (or `/v1/value`'s query). `$lease` in a body is the last lease
/// `/v1/acquire` handed out. At most 16 calls are made.
///
/// Checks that no call panics or is answered with a 5xx, and the rules of
/// who may call what: a foreign page without a token is a 403; a body not
/// sent as JSON is a 415 (or the 401 of a call that needs a token first);
/// a privileged call succeeds only with a token; a refused call (401, 403,
/// 415) changes neither the key it names nor the keys held nor the limit
/// it would bring; a refund never leaves a key above its capacity; and a
/// lease is released at most once.
pub fn api_calls(data: &[u8]) {
    let (api_token, data) = match data.strip_prefix(b"!") {
        Some(rest) => (false, rest),
        None => (true, data),
    };
    let state = state_with(api_token.then_some(API_TOKEN));
    let app = sluice_server::serve::app(Arc::clone(&state));
    let mut lease: Option<String> = None;
    let mut released: Vec<String> = Vec::new();
    block_on(async {
        for line in data.split(|&b| b == b'\n').take(MAX_CALLS) {
            let [endpoint, caller, rest @ ..] = line else {
                continue;
            };
            let (method, path) =
                &ENDPOINTS[usize::from(endpoint.wrapping_sub(b'0')) % ENDPOINTS.len()];
            let caller = Caller::of(*caller);
            let body = match &lease {
                Some(l) => String::from_utf8_lossy(rest)
                    .replace("$lease", l)
                    .into_bytes(),
                None => rest.to_vec(),
            };
            let uri = if method == Method::GET {
                format!("{path}?{}", query(&body))
            } else {
                (*path).to_owned()
            };
            let parsed: Option<Value> = serde_json::from_slice(&body).ok();
            let before = snapshot(&state, parsed.as_ref());
            let Ok(response) = app
                .clone()
                .oneshot(caller.request(method, &uri, body.clone()))
                .await;
            let status = response.status();
            let answer: Option<Value> = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let shown = || {
                format!(
                    "{method} {path} {:?}: {status} {answer:?}",
                    String::from_utf8_lossy(&body)
                )
            };
            assert!(!status.is_server_error(), "{}", shown());

            // Who may call what.
            let token = caller.has_token(api_token);
            if caller.page != Page::None && !token {
                assert_eq!(status, StatusCode::FORBIDDEN, "a foreign page: {}", shown());
            } else if method == Method::POST
                && matches!(caller.body, Type::TextPlain | Type::Untyped)
            {
                let first = match *path {
                    "/v1/reset" if caller.auth != Auth::Admin => StatusCode::UNAUTHORIZED,
                    "/v1/refund" if api_token && !token => StatusCode::UNAUTHORIZED,
                    _ => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                };
                assert_eq!(status, first, "a body not sent as JSON: {}", shown());
            }
            let made = status.is_success() || status == StatusCode::TOO_MANY_REQUESTS;
            // Without an API token, privileged calls are open to callers
            // that are not foreign pages, which the first rule holds.
            if made && api_token && privileged(path, parsed.as_ref()) {
                assert!(token, "a privileged call without a token: {}", shown());
            }
            if matches!(status.as_u16(), 401 | 403 | 415) {
                assert!(
                    before == snapshot(&state, parsed.as_ref()),
                    "a refused call changed something: {}",
                    shown()
                );
            }

            // What the calls that were made answered.
            let Some(answer) = &answer else { continue };
            match *path {
                "/v1/refund" if status.is_success() => {
                    let (remaining, limit) =
                        (answer["remaining"].as_f64(), answer["limit"].as_f64());
                    if let (Some(remaining), Some(limit)) = (remaining, limit) {
                        assert!(
                            remaining <= limit,
                            "a refund above the capacity: {}",
                            shown()
                        );
                    }
                }
                "/v1/acquire" => {
                    if let Some(l) = answer["lease"].as_str() {
                        lease = Some(l.to_owned());
                    }
                }
                "/v1/release" if answer["released"] == true => {
                    let l = parsed
                        .as_ref()
                        .and_then(|p| p["lease"].as_str())
                        .unwrap_or_default();
                    assert!(
                        !released.iter().any(|r| r == l),
                        "released twice: {}",
                        shown()
                    );
                    released.push(l.to_owned());
                }
                _ => {}
            }
        }
    });
}

/// Whether a call to `path` with `body` uses what needs the API token:
/// `/v1/refund`, `force`, `reserve` on `/v1/limit`, or a limit brought
/// inline. A field sent as `null` is one not sent.
fn privileged(path: &str, body: Option<&Value>) -> bool {
    let given = |field: &str| {
        body.and_then(|b| b.get(field))
            .is_some_and(|v| !v.is_null())
    };
    let set = |field: &str| body.and_then(|b| b.get(field)) == Some(&Value::Bool(true));
    match path {
        "/v1/refund" => true,
        "/v1/limit" => {
            set("force") || set("reserve") || given("algorithm") || given("algorithm_config")
        }
        "/v1/check" => set("force") || given("algorithm") || given("algorithm_config"),
        _ => false,
    }
}

/// What a call naming `body`'s `limit` and `key` could change: the keys the
/// store holds, that key's state, and the configuration the limit's name
/// has (the policy's, an inline one's, or none).
fn snapshot(state: &ServerState<FakeClock>, body: Option<&Value>) -> (usize, String, String) {
    let AnyStore::Memory(store) = state.enforcer.store() else {
        unreachable!("the fuzzing state is in memory");
    };
    let field = |name: &str| body.and_then(|b| b[name].as_str());
    let policy = state.enforcer.policy();
    let named = field("limit").and_then(|name| state.enforcer.limit_named(&policy, name));
    let value = match (&named, field("key")) {
        (Some(named), Some(key)) => format!("{:?}", store.value_now(named.limit(), key)),
        _ => String::new(),
    };
    let config = named
        .map(|n| format!("{:?}", n.limit()))
        .unwrap_or_default();
    (store.len(), value, config)
}
