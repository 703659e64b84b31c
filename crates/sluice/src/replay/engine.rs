//! Decides replayed events against a policy on an in-memory store whose
//! clock is the events' virtual time.

use serde::Serialize;
use sluice_core::{
    CostError, Decision, FakeClock, Limit, MemoryStore, Mode, Nanos, Op, Outcome, StoreError,
};
use sluice_policy::{Mode as RuleMode, Policy, RequestParts, RuleHit, StoreConfig};

use super::summary::Summary;

/// One output line: the decision for one event.
#[derive(Debug, Serialize)]
pub(crate) struct Line<'a> {
    pub(crate) t: &'a serde_json::Number,
    pub(crate) allowed: bool,
    pub(crate) rule: Option<&'a str>,
    #[serde(serialize_with = "crate::numbers::optional_number")]
    pub(crate) limit: Option<f64>,
    pub(crate) remaining: Option<u64>,
    pub(crate) retry_after: Option<f64>,
    pub(crate) reset: Option<f64>,
    /// Shadow rules that would have denied the event.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) shadow_denied: Vec<&'a str>,
    /// Why a call could not be decided (a cost that can never succeed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

impl<'a> Line<'a> {
    fn none(t: &'a serde_json::Number) -> Line<'a> {
        Line {
            t,
            allowed: true,
            rule: None,
            limit: None,
            remaining: None,
            retry_after: None,
            reset: None,
            shadow_denied: Vec::new(),
            error: None,
        }
    }

    fn decided(t: &'a serde_json::Number, rule: &'a str, d: &Decision, allowed: bool) -> Line<'a> {
        Line {
            allowed,
            rule: Some(rule),
            limit: Some(d.limit),
            remaining: Some(d.remaining),
            retry_after: d.retry_after,
            reset: Some(d.reset),
            ..Line::none(t)
        }
    }

    fn refused(
        t: &'a serde_json::Number,
        rule: &'a str,
        limit: &Limit,
        err: &CostError,
    ) -> Line<'a> {
        Line {
            allowed: false,
            rule: Some(rule),
            limit: Some(limit.algorithm().capacity()),
            error: Some(err.to_string()),
            ..Line::none(t)
        }
    }
}

pub(crate) struct Engine {
    policy: Policy,
    clock: FakeClock,
    store: MemoryStore<FakeClock>,
    rng: fastrand::Rng,
    pub(crate) summary: Summary,
}

impl Engine {
    pub(crate) fn new(policy: Policy, seed: u64) -> Engine {
        let clock = FakeClock::new(Nanos::ZERO);
        let mut store = MemoryStore::with_clock(clock.clone());
        if let StoreConfig::Memory {
            max_keys: Some(max),
        } = policy.store()
        {
            store = store.with_max_keys(*max);
        }
        let summary = Summary::new(&policy);
        Engine {
            policy,
            clock,
            store,
            rng: fastrand::Rng::with_seed(seed),
            summary,
        }
    }

    /// Moves virtual time to `t` seconds.
    pub(crate) fn set_time(&self, t: f64) -> anyhow::Result<()> {
        let now =
            Nanos::from_secs_f64(t).ok_or_else(|| anyhow::anyhow!("`t` = {t} is out of range"))?;
        self.clock.set(now);
        Ok(())
    }

    /// An operation whose shard choice comes from the seeded generator, so
    /// that replays repeat exactly.
    fn op<'k>(rng: &mut fastrand::Rng, limit: &'k Limit, key: &'k str, cost: f64) -> Op<'k> {
        Op::new(limit, key, cost).with_pick(rng.u64(..))
    }

    /// The proxies whose forwarding headers name a request's client.
    pub(crate) fn trusted_proxies(&self) -> &sluice_policy::TrustedProxies {
        self.policy.trusted_proxies()
    }

    /// All matching enforce rules as one transaction; each shadow rule on
    /// its own, reported but never denying.
    pub(crate) fn request<'a>(
        &'a mut self,
        t: &'a serde_json::Number,
        req: &RequestParts,
    ) -> Line<'a> {
        let policy = &self.policy;
        // Names are taken from the policy, which outlives the request.
        let name = |h: &RuleHit<'_>| policy.rules().get(h.index).map_or("", |r| r.name());
        let (enforce, shadow): (Vec<RuleHit<'_>>, Vec<RuleHit<'_>>) = policy
            .matching(req)
            .partition(|h| h.rule.mode() == RuleMode::Enforce);

        let mut shadow_denied = Vec::new();
        for hit in &shadow {
            let op = Self::op(&mut self.rng, hit.rule.limit(), &hit.key, hit.cost);
            let allowed = !hit.missing
                && match self.store.transact_now(&[op], Mode::CONSUME) {
                    Ok(out) => out.allowed,
                    Err(_) => false,
                };
            self.summary.shadow(hit, allowed);
            if !allowed {
                shadow_denied.push(name(hit));
            }
        }

        let mut ops = Vec::with_capacity(enforce.len());
        for h in &enforce {
            ops.push(Self::op(&mut self.rng, h.rule.limit(), &h.key, h.cost));
        }
        let result = if let Some(hit) = enforce.iter().find(|h| h.missing) {
            // `on_missing: deny`: refused before the store is asked, so no
            // other rule consumes either.
            Err(hit)
        } else {
            Ok(self.store.transact_now(&ops, Mode::CONSUME))
        };
        let mut line = match result {
            _ if enforce.is_empty() => Line::none(t),
            Err(hit) => Line {
                allowed: false,
                rule: Some(name(hit)),
                limit: Some(hit.rule.limit().algorithm().capacity()),
                error: Some("a part of the rule's key is missing".into()),
                ..Line::none(t)
            },
            Ok(Ok(outcome)) => {
                self.summary.enforced(&enforce, &outcome);
                decided(t, &outcome, |i| name(&enforce[i]))
            }
            Ok(Err(err)) => {
                // The first op whose cost is refused names the rule.
                let refused = ops
                    .iter()
                    .zip(&enforce)
                    .find_map(|(op, hit)| op.validate(false).err().map(|e| (hit, e)));
                match refused {
                    Some((hit, e)) => {
                        self.summary.refused(hit);
                        Line::refused(t, name(hit), hit.rule.limit(), &e)
                    }
                    None => Line {
                        allowed: false,
                        error: Some(err.to_string()),
                        ..Line::none(t)
                    },
                }
            }
        };
        line.shadow_denied = shadow_denied;
        let matched = !(enforce.is_empty() && shadow.is_empty());
        self.summary.event(line.allowed, matched);
        line
    }

    /// A call to a named limit.
    pub(crate) fn call<'a>(
        &'a mut self,
        t: &'a serde_json::Number,
        name: &str,
        key: &str,
        count: f64,
        reserve: bool,
    ) -> anyhow::Result<Line<'a>> {
        let Some(named) = self.policy.named_limit(name) else {
            anyhow::bail!("no limit named {name:?} in the policy");
        };
        let limit = named.limit().clone();
        let mode = if reserve {
            Mode::RESERVE
        } else {
            Mode::CONSUME
        };
        let op = Self::op(&mut self.rng, &limit, key, count);
        let line = match self.store.transact_now(&[op], mode) {
            Ok(outcome) => {
                self.summary.call(name, key, count, &outcome);
                let name = self.policy.named_limit(name).map_or("", |n| n.name());
                decided(t, &outcome, |_| name)
            }
            Err(StoreError::Cost(e)) => {
                let name = self.policy.named_limit(name).map_or("", |n| n.name());
                Line::refused(t, name, &limit, &e)
            }
            Err(e) => return Err(e.into()),
        };
        self.summary.event(line.allowed, true);
        Ok(line)
    }
}

fn decided<'a>(
    t: &'a serde_json::Number,
    outcome: &Outcome,
    rule: impl Fn(usize) -> &'a str,
) -> Line<'a> {
    match outcome.deciding() {
        Some(i) => {
            let mut line = Line::decided(t, rule(i), &outcome.decisions[i], outcome.allowed);
            // The transaction waits for its slowest member.
            line.retry_after = outcome.retry_after();
            line
        }
        None => Line::none(t),
    }
}
