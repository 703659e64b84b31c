//! `/v1/enforce` (formerly `/v1/decide`, still answered there): a request
//! event run through the policy's rules.

use super::*;

/// A request to run through the rules, in the shape `sluice replay` reads.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Event {
    /// The time replay would decide it at. The server decides at its own
    /// time; a `t` is taken so that replay's lines can be sent as they are.
    #[serde(rename = "t")]
    _t: Option<serde_json::Number>,
    ip: Option<IpAddr>,
    #[serde(default = "get_method")]
    method: String,
    #[serde(default = "root")]
    path: String,
    host: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    query: String,
}

pub(super) fn get_method() -> String {
    "GET".into()
}

pub(super) fn root() -> String {
    "/".into()
}

#[derive(Debug, Serialize)]
pub(super) struct EnforceAnswer {
    allowed: bool,
    rule: Option<String>,
    limit: Option<f64>,
    remaining: Option<u64>,
    retry_after: Option<f64>,
    reset: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    shadow_denied: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// `fail_open` or `fail_closed` on a verdict made without the store;
    /// absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    degraded: Option<&'static str>,
    headers: BTreeMap<String, String>,
}

pub(super) async fn enforce<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    let e: Event = match json(req).await {
        Ok(e) => e,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let parts = RequestParts {
        ip: e.ip,
        method: e.method,
        path: e.path,
        host: e.host,
        headers: e.headers.into_iter().collect(),
        query: e.query,
        ..RequestParts::default()
    }
    // `ip` is the peer the request came from, as a socket reports it.
    .with_client_behind(policy.trusted_proxies());
    let mut verdict = s.enforcer.enforce_with(&policy, &parts).await;
    // Nothing here learns when the request's work ends: slots it took on
    // concurrency rules are released right after it is decided (use /v1/acquire
    // and /v1/release, the middleware or the proxy to hold one).
    let _slots = s.enforcer.hold(&mut verdict);
    enforced(&verdict)
}

pub(super) fn enforced(v: &Verdict) -> Response {
    let mut headers = BTreeMap::new();
    each_rate_limit_header(v, |name, value| {
        headers.insert(name.as_str().to_owned(), value.into());
    });
    let (status, error) = if v.allowed {
        (StatusCode::OK, None)
    } else {
        let problem = Problem::denial(v);
        headers.insert(
            header::CONTENT_TYPE.as_str().to_owned(),
            PROBLEM_JSON.to_str().unwrap_or_default().to_owned(),
        );
        (problem.status(), Some(problem.detail().to_owned()))
    };
    let d = v.deciding();
    let answer = EnforceAnswer {
        allowed: v.allowed,
        rule: v
            .denied_by()
            .map(str::to_owned)
            .or_else(|| d.map(|d| d.rule.clone())),
        limit: d.map(|d| d.decision.capacity),
        remaining: d.map(|d| d.decision.remaining),
        retry_after: v.retry_after,
        reset: d.map(|d| d.decision.reset),
        shadow_denied: v.shadow_denied().map(str::to_owned).collect(),
        error: error
            .filter(|_| v.refusal.is_some())
            .map(|e| clip(&e).into_owned()),
        degraded: v.without_store.map(degraded),
        headers,
    };
    (status, axum::Json(answer)).into_response()
}
