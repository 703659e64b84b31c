//! How a decision is answered: its JSON, and the problems a call can meet.

use super::*;

#[derive(Debug, Serialize)]
pub(super) struct Answer {
    allowed: bool,
    #[serde(serialize_with = "crate::numbers::number")]
    limit: f64,
    remaining: u64,
    retry_after: Option<f64>,
    reset: f64,
    /// `fail_open` on a decision made without the store; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    degraded: Option<&'static str>,
}

impl From<Decision> for Answer {
    fn from(d: Decision) -> Answer {
        Answer {
            allowed: d.allowed,
            limit: d.capacity,
            remaining: d.remaining,
            retry_after: d.retry_after,
            reset: d.reset,
            degraded: None,
        }
    }
}

impl From<NamedDecision> for Answer {
    fn from(d: NamedDecision) -> Answer {
        Answer {
            degraded: d.without_store.map(degraded),
            ..Answer::from(d.decision)
        }
    }
}

/// 200 when allowed, 429 when not, with the decision as JSON.
pub(super) fn answer(d: impl Into<Answer>) -> Response {
    let answer = d.into();
    let status = if answer.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    json_response(status, &answer)
}

/// `value` as a JSON response. Written into a `Vec` sized for a decision
/// rather than through `axum::Json`'s growable buffer, whose per-write
/// bookkeeping cost a `/v1/limit` call about 1,600 instructions (callgrind).
pub(super) fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response {
    let mut body = Vec::with_capacity(128);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => {
            let mut res = Response::new(Body::from(body));
            *res.status_mut() = status;
            res.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            res
        }
        Err(e) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer could not be written: {e}"),
        ),
    }
}

/// The count a body gives (1 when it gives none): a 400 for one below 0,
/// and a 422 for a whole number above 2⁵³, which a double cannot hold
/// exactly and would round into range.
#[allow(clippy::result_large_err)]
pub(super) fn count_of(count: Option<&serde_json::Number>) -> Result<f64, Response> {
    let Some(n) = count else {
        return Ok(1.0);
    };
    if n.as_u64()
        .is_some_and(|u| u > sluice_core::MAX_EXACT_TOKENS as u64)
    {
        return Err(problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("`count` must be at most 2^53, got {n}"),
        ));
    }
    match n.as_f64() {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(problem(
            StatusCode::BAD_REQUEST,
            format!("`count` must be a finite number ≥ 0, got {n}"),
        )),
    }
}

pub(super) fn unknown_limit(name: &str) -> Response {
    problem(
        StatusCode::NOT_FOUND,
        format!("no limit named {name:?} in the policy, nor given inline"),
    )
}

pub(super) fn store_failed(e: &StoreError) -> Response {
    match e {
        StoreError::Cost(c) => problem(StatusCode::UNPROCESSABLE_ENTITY, c.to_string()),
        other => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store could not decide: {other}"),
        ),
    }
}
