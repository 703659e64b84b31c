//! `/v1/limit`, `/v1/check` and `/v1/refund`: a call on a named or inline limit.

use super::*;

/// A `/v1/limit` or `/v1/check` body. Its strings borrow from the body
/// unless they hold escapes: a call on a policy's limit allocates nothing
/// to be read. A call that brings its own limit gives its `algorithm` and
/// `algorithm_config`, and `limit` names its state.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Call<'a> {
    #[serde(borrow)]
    limit: Cow<'a, str>,
    #[serde(borrow)]
    key: Cow<'a, str>,
    count: Option<serde_json::Number>,
    #[serde(default)]
    reserve: bool,
    /// Charge whatever the key holds, below zero if need be: a cost
    /// settled after the fact (see [`Settle::Charge`]).
    #[serde(default)]
    force: bool,
    algorithm: Option<serde_json::Value>,
    algorithm_config: Option<serde_json::Value>,
}

impl Call<'_> {
    /// What in the call needs the API token, if anything: what can hold a
    /// key back for others (`force`, and `reserve` on a call that takes),
    /// or define or redefine a limit (`algorithm`, `algorithm_config`).
    /// A check that reserves changes nothing, so it needs none.
    fn privileged(&self, consume: bool) -> Option<&'static str> {
        if self.force {
            Some("`force`")
        } else if consume && self.reserve {
            Some("`reserve`")
        } else if self.algorithm.is_some() || self.algorithm_config.is_some() {
            Some("a limit brought inline (`algorithm`, `algorithm_config`)")
        } else {
            None
        }
    }
}

pub(super) async fn call<C: Clock + Send + Sync + 'static>(
    state: &ServerState<C>,
    req: Request,
    consume: bool,
) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match json_body(&parts.headers, body).await {
        Ok(b) => b,
        Err(res) => return res,
    };
    let call: Call<'_> = match parse(&bytes) {
        Ok(c) => c,
        Err(res) => return res,
    };
    if let Some(what) = call.privileged(consume)
        && let Some(refused) = privilege_refusal(state, &parts.headers, what)
    {
        return refused;
    }
    let count = match count_of(call.count.as_ref()) {
        Ok(c) => c,
        Err(res) => return res,
    };
    let policy = state.enforcer.policy();
    let inline;
    let named = match (&call.algorithm, &call.algorithm_config) {
        // A policy's limit first, without the `Arc` an inline one comes in.
        (None, None) => match policy.named_limit(&call.limit) {
            Some(named) => named,
            None => match state.enforcer.limit_named(&policy, &call.limit) {
                Some(limit) => {
                    inline = limit;
                    &*inline
                }
                None => return unknown_limit(&call.limit),
            },
        },
        (Some(algorithm), config) => {
            let config = config.as_ref().unwrap_or(&serde_json::Value::Null);
            match state
                .enforcer
                .inline_limit(&policy, &call.limit, algorithm, config)
            {
                Ok(limit) => {
                    inline = limit;
                    &*inline
                }
                Err(e) => return problem(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
            }
        }
        (None, Some(_)) => {
            return problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "`algorithm_config` needs the `algorithm` it configures".into(),
            );
        }
    };
    if consume && named.limit().takes_leases() {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "limit {:?} counts calls in flight: take a slot with /v1/acquire, which \
                 answers with the lease to release when the call ends",
                named.name()
            ),
        );
    }
    if call.force {
        return match (consume, call.reserve) {
            (true, false) => settled(
                state
                    .enforcer
                    .settle_named(named, &call.key, Settle::Charge(count))
                    .await,
            ),
            (false, _) => problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "a check changes nothing, so it cannot be forced: send `force` to /v1/limit".into(),
            ),
            (true, true) => problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "`force` charges at once whatever the key holds, so it takes no `reserve`".into(),
            ),
        };
    }
    let mode = match (consume, call.reserve) {
        (false, r) => Mode {
            consume: false,
            reserve: r,
        },
        (true, true) => Mode::RESERVE,
        (true, false) => Mode::CONSUME,
    };
    match state
        .enforcer
        .decide_named(named, &call.key, count, mode)
        .await
    {
        Ok(d) => answer(d),
        Err(e) => store_failed(&e),
    }
}

pub(super) async fn limit<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    call(&s, req, true).await
}

pub(super) async fn check<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    call(&s, req, false).await
}

/// A settlement's answer: the key as it stands, always 200.
pub(super) fn settled(result: Result<Decision, StoreError>) -> Response {
    match result {
        Ok(d) => answer(d),
        Err(e) => store_failed(&e),
    }
}

/// A `/v1/refund` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Refund {
    limit: String,
    key: String,
    count: serde_json::Number,
}

/// Gives `count` tokens back to a key of a policy's limit, or of an inline
/// limit the server knows, never above its capacity. A refund can fill a
/// key that others emptied, so it is privileged; the token is checked
/// before the body is read.
pub(super) async fn refund<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    if let Some(refused) = privilege_refusal(&s, req.headers(), "/v1/refund") {
        return refused;
    }
    let r: Refund = match json(req).await {
        Ok(r) => r,
        Err(res) => return res,
    };
    let count = match count_of(Some(&r.count)) {
        Ok(c) => c,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &r.limit) else {
        return unknown_limit(&r.limit);
    };
    settled(
        s.enforcer
            .settle_named(&named, &r.key, Settle::Refund(count))
            .await,
    )
}
