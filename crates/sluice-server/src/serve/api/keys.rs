//! `/v1/reset` and `/v1/value`: one key of a named limit.

use super::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyRef {
    limit: String,
    key: String,
}

pub(super) async fn reset<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    if !is_admin(&s, req.headers()) {
        let detail = if s.admin_token.is_some() {
            "resetting a key needs the admin token: `Authorization: Bearer <token>`"
        } else {
            "admin endpoints are disabled: start the server with --admin-token"
        };
        return bearer_needed(detail.into());
    }
    let r: KeyRef = match json(req).await {
        Ok(r) => r,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &r.limit) else {
        return unknown_limit(&r.limit);
    };
    match s.enforcer.reset_named(&named, &r.key).await {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({"reset": true})),
        )
            .into_response(),
        Err(e) => store_failed(&e),
    }
}

pub(super) async fn value<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    query: Result<Query<KeyRef>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(r) = match query {
        Ok(q) => q,
        Err(e) => return problem(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &r.limit) else {
        return unknown_limit(&r.limit);
    };
    let limit = named.limit();
    match s.enforcer.store().value(limit, &r.key).await {
        Ok(v) => axum::Json(serde_json::json!({
            "limit": limit.algorithm().capacity(),
            "tokens": v.tokens,
            "remaining": if v.tokens > 0.0 { v.tokens.floor() } else { 0.0 },
        }))
        .into_response(),
        Err(e) => store_failed(&e),
    }
}
