//! Who may call what: the admin and API tokens, and calls from web pages.

use super::*;

/// Whether `headers` carry the admin token as a bearer token.
pub(super) fn is_admin<C>(state: &ServerState<C>, headers: &HeaderMap) -> bool {
    state
        .admin_token
        .as_deref()
        .is_some_and(|token| holds_token(token, headers, false))
}

/// Whether `headers` carry the API token or the admin token as a bearer
/// token. The admin token does whatever the API token does: whoever holds
/// it may reset any key, more than a privileged call can do.
pub(super) fn carries_a_token<C>(state: &ServerState<C>, headers: &HeaderMap) -> bool {
    let api = state
        .api_token
        .as_deref()
        .is_some_and(|token| holds_token(token, headers, false));
    api || is_admin(state, headers)
}

/// The 401 for `what`, a privileged part of a call, without the token;
/// none when the call carries it or the server has no API token, which
/// leaves privileged calls open to every caller (the server says so when
/// it starts).
pub(super) fn privilege_refusal<C>(
    state: &ServerState<C>,
    headers: &HeaderMap,
    what: &str,
) -> Option<Response> {
    if state.api_token.is_none() || carries_a_token(state, headers) {
        return None;
    }
    Some(bearer_needed(format!(
        "{what} needs the API token: `Authorization: Bearer <token>`"
    )))
}

/// A 401 that asks for a bearer token.
pub(super) fn bearer_needed(detail: String) -> Response {
    let mut res = problem(StatusCode::UNAUTHORIZED, detail);
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

/// The 403 for a request to a decision endpoint that a browser sent for a
/// web page other than the server's own (see [`foreign_page`]), unless it
/// carries a token: a page can have its visitors' browsers call whatever
/// address they reach. The dashboard's paths answer by a rule of their
/// own, and the operational endpoints, which change nothing and name no
/// key, answer anyone.
pub(super) fn page_refusal<C>(state: &ServerState<C>, req: &Request) -> Option<Response> {
    let path = req.uri().path();
    if !path.starts_with("/v1/") || path == dashboard::STATS {
        return None;
    }
    let why = foreign_page(req.uri(), req.headers())?;
    if carries_a_token(state, req.headers()) {
        return None;
    }
    Some(problem(
        StatusCode::FORBIDDEN,
        format!(
            "the decision API answers no web page but the server's own, opened by address: \
             {why}. Call it from a service, or with the API token"
        ),
    ))
}
