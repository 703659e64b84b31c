//! Envoy's rate limit service (RLS v3, `ShouldRateLimit`) over gRPC: the
//! descriptors of one call are decided by the policy's rules for the call's
//! domain, all of them as one transaction, so a descriptor that is over its
//! limit never spends another descriptor's quota.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, Struct, Value};
use sluice_core::{Algorithm, Clock, Decision, Outcome, Settle, Store};
use sluice_engine::{Enforcer, Verdict};
use sluice_http::{PROBLEM_JSON, degraded, denial, each_rate_limit_header};
use sluice_policy::{Enforcement, NamedLimit, Policy, Rule, RuleHit};
use smallvec::SmallVec;
use tonic::{Request, Response, Status};

use crate::listen::Listener;
use crate::ops::ServerState;

/// The gRPC service: Envoy's `RateLimitService` answered from the policy's
/// rules that name a `domain`.
///
/// ```
/// # use std::sync::Arc;
/// use sluice_server::serve::{AnyStore, ServerState, Rls};
/// # use sluice_core::MemoryStore;
/// # use sluice_http::Enforcer;
/// # use sluice_policy::Policy;
/// let state = Arc::new(ServerState {
///     enforcer: Arc::new(Enforcer::new(Policy::default(), AnyStore::Memory(MemoryStore::new()))),
///     admin_token: None,
///     api_token: None,
///     metrics: None,
///     reload_error: Default::default(),
///     dashboard: None,
/// });
/// let _server = Rls::new(state).into_server();
/// ```
pub struct Rls<C> {
    state: Arc<ServerState<C>>,
}

impl<C: Clock + Send + Sync + 'static> Rls<C> {
    /// The service over the server's shared state.
    pub fn new(state: Arc<ServerState<C>>) -> Self {
        Rls { state }
    }

    /// The tonic server that routes `ShouldRateLimit` here.
    pub fn into_server(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }
}

/// How often an idle HTTP/2 connection is pinged, so that a peer that
/// vanished is noticed; Envoy answers pings.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);

/// How long a ping may go unanswered before the connection is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves RLS on `listener` until `stop` completes, then lets calls in
/// flight finish within the listener's shutdown timeout. A call that takes
/// longer than `call_timeout`, a stalled request body included, is ended
/// with `CANCELLED`.
pub async fn serve_grpc<C: Clock + Send + Sync + 'static>(
    listener: Listener,
    state: Arc<ServerState<C>>,
    call_timeout: Duration,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_rate_limit_service(listener, Rls::new(state), call_timeout, stop).await
}

/// Serves any implementation of Envoy's rate limit service as
/// [`serve_grpc`] serves [`Rls`]: on the same listener, tonic server, call
/// timeout, HTTP/2 keep-alive and graceful stop. `sluice bench
/// rls-baseline` serves one that decides nothing, so that it and `sluice
/// serve` differ only in the service.
pub async fn serve_rate_limit_service<S: RateLimitService>(
    listener: Listener,
    service: S,
    call_timeout: Duration,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (incoming, drain) = listener.incoming();
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .timeout(call_timeout)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(RateLimitServiceServer::new(service))
        .serve_with_incoming_shutdown(incoming, async move {
            stop.await;
            let _ = stopping.send(());
        });
    tokio::pin!(server);
    let mut failed = None;
    tokio::select! {
        biased;
        result = &mut server => return result.map_err(grpc_failed),
        _ = stopped => {}
    }
    drain
        .finish(async {
            failed = (&mut server).await.err();
        })
        .await;
    failed.map_or(Ok(()), |e| Err(grpc_failed(e)))
}

fn grpc_failed(e: tonic::transport::Error) -> anyhow::Error {
    anyhow::anyhow!("the gRPC server failed: {e}")
}

#[tonic::async_trait]
impl<C: Clock + Send + Sync + 'static> RateLimitService for Rls<C> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
        if req.domain.is_empty() {
            return Err(Status::invalid_argument("the rate limit domain is empty"));
        }
        if req.descriptors.is_empty() {
            return Err(Status::invalid_argument(
                "the rate limit request has no descriptors",
            ));
        }
        let enforcer = &self.state.enforcer;
        let policy = enforcer.policy();
        // A call names a descriptor or two: these lists stay off the heap.
        let parts: SmallVec<[Descriptor<'_>; 2]> = req
            .descriptors
            .iter()
            .map(|d| Descriptor(&d.entries))
            .collect();
        // Every rule each descriptor matches, with the descriptor it belongs
        // to; a negative-hits descriptor's rules are refunded instead.
        let mut hits: SmallVec<[RuleHit<'_>; 2]> = SmallVec::new();
        let mut owner: SmallVec<[usize; 2]> = SmallVec::new();
        let mut refunds: Vec<(usize, RuleHit<'_>)> = Vec::new();
        for (i, (d, p)) in req.descriptors.iter().zip(&parts).enumerate() {
            let cost = hits_of(d, req.hits_addend);
            for mut hit in policy.matching_domain(&req.domain, p) {
                hit.cost = cost;
                if let Some(o) = &d.limit {
                    hit.limit = overriding(enforcer, &policy, hit.rule, o);
                }
                if d.is_negative_hits {
                    refunds.push((i, hit));
                } else {
                    hits.push(hit);
                    owner.push(i);
                }
            }
        }
        // Refunds first: what a request gives back, its other descriptors
        // may use.
        let mut refunded: Vec<(usize, &RuleHit<'_>, Decision)> = Vec::new();
        for (i, hit) in &refunds {
            if hit.missing {
                continue;
            }
            // A failed refund is counted and logged by the enforcer; the
            // descriptor is not over its limit either way.
            if let Ok(d) = enforcer.settle_hit(hit, Settle::Refund(hit.cost)).await {
                refunded.push((*i, hit, d));
            }
        }
        let verdict = enforcer.enforce_hits(&hits).await;
        Ok(Response::new(response(
            &req, &hits, &owner, &verdict, &refunded,
        )))
    }
}

/// The limit a descriptor's `limit` override puts in place of `rule`'s: the
/// rule's algorithm at `requests_per_unit` per `unit` (for a token bucket,
/// with that many as its burst), its state named after the rule and the
/// override (`per-user@100/minute`), so that each override keeps its own
/// keys. An override the server cannot use (no known unit, a count the
/// rule's algorithm refuses, or one more than the server keeps) leaves the
/// rule's own limit in force, rather than fail the call and so let Envoy
/// admit every descriptor of it; it is counted in
/// `sluice_rls_overrides_ignored_total`.
fn overriding<S: Store + 'static>(
    enforcer: &Enforcer<S>,
    policy: &Policy,
    rule: &Rule,
    o: &RateLimitOverride,
) -> Option<Arc<NamedLimit>> {
    let ignored = |why: &str| {
        tracing::debug!(rule = rule.name(), why, "descriptor limit override ignored");
        metrics::counter!("sluice_rls_overrides_ignored_total", "rule" => rule.name().to_owned())
            .increment(1);
        None
    };
    // An override's `RateLimitUnit` numbers its units as an answer's
    // `Unit` does.
    let Some(&(_, unit, secs)) = UNITS.iter().find(|(u, ..)| *u as i32 == o.unit) else {
        return ignored("no known unit");
    };
    let limit = rule.limit();
    let mut config = serde_json::json!({"rate": o.requests_per_unit, "period": secs});
    if limit.shards() > 1 {
        config["shards"] = limit.shards().into();
    }
    let start = match limit.algorithm() {
        Algorithm::FixedWindow(fw) => fw.start(),
        Algorithm::SlidingWindow(sw) => sw.start(),
        Algorithm::TokenBucket(_) | Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => None,
    };
    if let Some(start) = start {
        config["start"] = start.as_secs_f64().into();
    }
    let name = format!("{}@{}/{unit}", rule.name(), o.requests_per_unit);
    let algorithm = serde_json::Value::from(limit.algorithm().name());
    match enforcer.override_limit(policy, &name, &algorithm, &config) {
        Ok(brought) => Some(brought),
        Err(e) => ignored(&e.to_string()),
    }
}

/// A descriptor as rules see it: a request whose only parts are its
/// entries, read in place. A key that appears twice answers with its first
/// value.
struct Descriptor<'a>(&'a [Entry]);

impl sluice_policy::Request for Descriptor<'_> {
    fn ip(&self) -> Option<IpAddr> {
        None
    }
    fn method(&self) -> &str {
        ""
    }
    fn path(&self) -> &str {
        ""
    }
    fn host(&self) -> Option<&str> {
        None
    }
    fn header(&self, _: &str) -> Option<&str> {
        None
    }
    fn query(&self, _: &str) -> Option<Cow<'_, str>> {
        None
    }
    fn descriptor(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    }
}

/// The hits of one descriptor: its own `hits_addend` when set, else the
/// request's, where 0 means 1. For a negative-hits descriptor, the tokens
/// to give back.
fn hits_of(d: &RateLimitDescriptor, request_hits: u32) -> f64 {
    match &d.hits_addend {
        Some(h) => h.value as f64,
        None => f64::from(request_hits.max(1)),
    }
}

/// The answer: a status per descriptor, in order, and the headers the HTTP
/// middleware would have set for the whole request (`Sluice-Degraded`
/// among them when the verdict was made without the store, which the
/// dynamic metadata's `degraded` says too, for Envoy's access log).
fn response(
    req: &RateLimitRequest,
    hits: &[RuleHit<'_>],
    owner: &[usize],
    verdict: &Verdict,
    refunded: &[(usize, &RuleHit<'_>, Decision)],
) -> RateLimitResponse {
    // The verdict lists enforced rules in the order of their hits.
    let enforced: SmallVec<[(usize, &RuleHit<'_>); 2]> = hits
        .iter()
        .zip(owner)
        .filter(|(h, _)| h.rule.enforcement() == Enforcement::Enforce)
        .map(|(h, &i)| (i, h))
        .collect();
    let refused = verdict.refusal.as_ref().map(|(rule, _)| rule.as_str());
    let statuses = (0..req.descriptors.len())
        .map(|i| {
            if req.descriptors[i].is_negative_hits {
                return refund_status(refunded.iter().filter(|(owner, ..)| *owner == i));
            }
            let mine: SmallVec<[(&RuleHit<'_>, Option<Decision>); 2]> = enforced
                .iter()
                .enumerate()
                .filter(|(_, (owner, _))| *owner == i)
                .map(|(k, (_, hit))| (*hit, verdict.rules.get(k).map(|r| r.decision)))
                .collect();
            status(&mine, refused)
        })
        .collect();

    // Straight into Envoy's list: these are the fields of every answer.
    let mut response_headers_to_add = Vec::with_capacity(9);
    let mut add = |key: &str, value: String| {
        response_headers_to_add.push(HeaderValue {
            key: key.to_owned(),
            value,
            raw_value: Vec::new(),
        });
    };
    each_rate_limit_header(verdict, |name, value| add(name.as_str(), value.into()));
    let mut raw_body = Vec::new();
    if !verdict.allowed {
        let (_, body) = denial(verdict);
        raw_body = body;
        add(
            http::header::CONTENT_TYPE.as_str(),
            PROBLEM_JSON.to_str().unwrap_or_default().to_owned(),
        );
    }
    let overall = if verdict.allowed {
        Code::Ok
    } else {
        Code::OverLimit
    };
    let dynamic_metadata = verdict.without_store.map(|how| Struct {
        fields: [(
            "degraded".to_owned(),
            Value {
                kind: Some(Kind::StringValue(degraded(how).to_owned())),
            },
        )]
        .into_iter()
        .collect(),
    });
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add,
        raw_body,
        dynamic_metadata,
        ..RateLimitResponse::default()
    }
}

/// One descriptor's status from the enforced rules it matched. Without any,
/// it is OK with no limit, as Envoy's reference service answers descriptors
/// it has no limit for.
fn status(mine: &[(&RuleHit<'_>, Option<Decision>)], refused: Option<&str>) -> DescriptorStatus {
    let Some(&(first, _)) = mine.first() else {
        return DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        };
    };
    // A refusal (a missing key or an impossible cost) decided before the
    // store was asked; the descriptor holding that rule is the one over.
    if let Some(hit) = refused.and_then(|name| mine.iter().find(|(h, _)| h.rule.name() == name)) {
        return DescriptorStatus {
            code: Code::OverLimit as i32,
            current_limit: Some(current_limit(hit.0)),
            ..DescriptorStatus::default()
        };
    }
    let decisions: SmallVec<[Decision; 2]> = mine.iter().filter_map(|(_, d)| *d).collect();
    if decisions.len() != mine.len() {
        // The transaction never reached the store (another descriptor's
        // refusal): nothing was consumed here, and this one is not over.
        return DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(current_limit(first)),
            ..DescriptorStatus::default()
        };
    }
    let outcome = Outcome::from_decisions(decisions);
    let k = outcome.deciding().unwrap_or(0);
    let (hit, d) = (mine[k].0, outcome.decisions[k]);
    DescriptorStatus {
        code: if outcome.allowed {
            Code::Ok
        } else {
            Code::OverLimit
        } as i32,
        current_limit: Some(current_limit(hit)),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(duration(d.reset)),
        ..DescriptorStatus::default()
    }
}

/// A negative-hits descriptor's status: never over its limit, with what
/// the most restrictive of its enforced rules holds after the refund.
fn refund_status<'a, 'h: 'a>(
    refunded: impl Iterator<Item = &'a (usize, &'a RuleHit<'h>, Decision)>,
) -> DescriptorStatus {
    let tightest = refunded
        .filter(|(_, hit, _)| hit.rule.enforcement() == Enforcement::Enforce)
        .min_by_key(|(_, _, d)| d.remaining);
    match tightest {
        Some((_, hit, d)) => DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(current_limit(hit)),
            limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(duration(d.reset)),
            ..DescriptorStatus::default()
        },
        None => DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        },
    }
}

/// Envoy's units of time: the name an override's state is named with, and
/// the seconds in each, as Envoy's reference service counts them (a month
/// is 30 days, a year 365). Not WEEK, which Envoy learned only lately: an
/// older one would not know the unit it was told a rate in.
const UNITS: [(Unit, &str, u32); 6] = [
    (Unit::Second, "second", 1),
    (Unit::Minute, "minute", 60),
    (Unit::Hour, "hour", 3_600),
    (Unit::Day, "day", 86_400),
    (Unit::Month, "month", 30 * 86_400),
    (Unit::Year, "year", 365 * 86_400),
];

/// The rule's rate in Envoy's terms: whole requests per second, minute,
/// hour, day, month or year. The smallest unit that states the rate exactly wins; a rate
/// no unit states exactly is rounded down in the first unit where it is at
/// least one, so Envoy never advertises more than the rule admits.
fn current_limit(hit: &RuleHit<'_>) -> RateLimit {
    let per_sec = match hit.limit().algorithm() {
        // Already per second, whatever period the rate was given over.
        Algorithm::TokenBucket(tb) => tb.rate(),
        Algorithm::FixedWindow(fw) => fw.rate() / fw.period().as_secs_f64(),
        Algorithm::SlidingWindow(sw) => sw.rate() / sw.period().as_secs_f64(),
        Algorithm::SlidingLog(sl) => sl.rate() / sl.period().as_secs_f64(),
        // Policies keep concurrency out of domains (Envoy never releases);
        // the most a key could start were its leases never released.
        Algorithm::Concurrency(c) => c.max() / c.lease().as_secs_f64(),
    };
    let (requests_per_unit, unit) = per_unit(per_sec);
    RateLimit {
        name: hit.rule.name().to_owned(),
        requests_per_unit,
        unit: unit as i32,
    }
}

fn per_unit(per_sec: f64) -> (u32, Unit) {
    let count = |secs: u32| per_sec * f64::from(secs);
    // A rate given per unit comes back from per second a rounding off.
    let exact = UNITS.iter().find(|&&(_, _, secs)| {
        let n = count(secs);
        n.round() >= 1.0 && (n - n.round()).abs() <= 1e-9 * n
    });
    let (unit, n) = match exact {
        Some(&(unit, _, secs)) => (unit, count(secs).round()),
        None => {
            let &(unit, _, secs) = UNITS
                .iter()
                .find(|&&(_, _, secs)| count(secs) >= 1.0)
                .unwrap_or(&UNITS[UNITS.len() - 1]);
            (unit, count(secs).floor())
        }
    };
    // The float-to-int cast saturates, which is what a u32 field wants.
    (n as u32, unit)
}

fn duration(secs: f64) -> PbDuration {
    let secs = if secs.is_finite() { secs.max(0.0) } else { 0.0 };
    let whole = secs.trunc();
    PbDuration {
        seconds: whole as i64,
        nanos: ((secs - whole) * 1e9) as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An override names its unit in `RateLimitUnit`, an answer in `Unit`;
    /// overrides are matched by number, which holds only while Envoy
    /// numbers the two alike.
    #[test]
    fn an_override_and_an_answer_number_their_units_alike() {
        use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
        for (unit, name, _) in UNITS {
            let theirs = RateLimitUnit::from_str_name(unit.as_str_name());
            assert_eq!(theirs.map(|u| u as i32), Some(unit as i32), "{name}");
        }
    }

    #[test]
    fn rates_take_the_smallest_exact_unit() {
        assert_eq!(per_unit(10.0), (10, Unit::Second));
        assert_eq!(per_unit(10.0 / 60.0), (10, Unit::Minute));
        assert_eq!(per_unit(0.5), (30, Unit::Minute));
        assert_eq!(per_unit(3.5), (210, Unit::Minute));
        assert_eq!(per_unit(1.0 / 86_400.0), (1, Unit::Day));
        assert_eq!(per_unit(1.0 / (30.0 * 86_400.0)), (1, Unit::Month));
        assert_eq!(per_unit(100.0 / (365.0 * 86_400.0)), (100, Unit::Year));
        // 1/7 per second is no whole number in any unit: rounded down in
        // the first unit that reaches one.
        assert_eq!(per_unit(1.0 / 7.0), (8, Unit::Minute));
        // Once a week: about 4.3 a month, never more than the rule admits.
        assert_eq!(per_unit(1.0 / (7.0 * 86_400.0)), (4, Unit::Month));
        assert_eq!(per_unit(1e-12), (0, Unit::Year));
        assert_eq!(per_unit(1e12), (u32::MAX, Unit::Second));
    }

    #[test]
    fn durations_split_seconds_and_nanos() {
        let d = duration(2.25);
        assert_eq!((d.seconds, d.nanos), (2, 250_000_000));
        let z = duration(f64::NAN);
        assert_eq!((z.seconds, z.nanos), (0, 0));
    }
}
