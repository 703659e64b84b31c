//! `/v1/acquire` and `/v1/release`: leases on concurrency limits.

use super::*;

/// A `/v1/acquire` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Acquire {
    limit: String,
    key: String,
    count: Option<serde_json::Number>,
}

/// What `/v1/acquire` answers: the decision, and the lease when admitted.
#[derive(Debug, Serialize)]
pub(super) struct Acquired {
    #[serde(flatten)]
    decision: Answer,
    /// The lease's id, as a string (it is a 53-bit number, which not every
    /// JSON reader keeps exact); null when denied.
    lease: Option<String>,
    /// Seconds until the lease expires if it is never released; null when
    /// denied.
    expires: Option<f64>,
}

/// Takes `count` slots (1 by default) of a key of a concurrency limit under
/// a new lease: 200 with the lease, or 429 when the key's slots are taken.
pub(super) async fn acquire<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    let a: Acquire = match json(req).await {
        Ok(a) => a,
        Err(res) => return res,
    };
    let count = match count_of(a.count.as_ref()) {
        Ok(c) => c,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &a.limit) else {
        return unknown_limit(&a.limit);
    };
    let Algorithm::Concurrency(c) = named.limit().algorithm() else {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "limit {:?} is a {}, which holds no leases: call /v1/limit",
                named.name(),
                named.limit().algorithm().name()
            ),
        );
    };
    let lease_secs = c.lease().as_secs_f64();
    match s.enforcer.acquire_named(&named, &a.key, count).await {
        Ok((d, held)) => {
            let status = if d.decision.allowed {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            let answer = Acquired {
                decision: Answer::from(d),
                lease: held.as_ref().map(|h| h.lease.to_string()),
                expires: held.map(|_| lease_secs),
            };
            json_response(status, &answer)
        }
        Err(e) => store_failed(&e),
    }
}

/// A `/v1/release` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Release {
    limit: String,
    key: String,
    lease: String,
}

/// Gives a lease's slots back. Releasing a lease that is unknown, expired
/// or released already is no error: the answer says it released nothing.
pub(super) async fn release<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    req: Request,
) -> Response {
    let r: Release = match json(req).await {
        Ok(r) => r,
        Err(res) => return res,
    };
    let policy = s.enforcer.policy();
    let Some(named) = s.enforcer.limit_named(&policy, &r.limit) else {
        return unknown_limit(&r.limit);
    };
    // Not a lease this server could have handed out: nothing to release.
    let released = match r.lease.parse::<u64>() {
        Ok(lease) if lease > 0 => {
            let held = sluice_engine::HeldLease {
                limit: named.limit().clone(),
                key: r.key,
                lease,
            };
            match s.enforcer.release(&held).await {
                Ok(released) => released,
                Err(e) => return store_failed(&e),
            }
        }
        _ => false,
    };
    json_response(StatusCode::OK, &serde_json::json!({ "released": released }))
}
