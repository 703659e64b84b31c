//! Decides replayed events with the engine every front end uses, on a store
//! whose clock is the events' virtual time, and keeps the run's totals.

use std::sync::Arc;

use sluice_core::{FakeClock, MemoryStore, Mode, Nanos, Settle, Store, StoreError};
use sluice_engine::{Enforcer, Verdict};
use sluice_policy::{Policy, RequestParts, StoreConfig, TrustedProxies};

use super::event::Call;
use super::line::Line;
use super::summary::Summary;

/// An enforcer whose store runs on virtual time, with the run's totals.
pub(crate) struct Replayer<S> {
    enforcer: Enforcer<S>,
    /// The enforcer's policy, taken once: a replay never reloads.
    policy: Arc<Policy>,
    clock: FakeClock,
    pub(crate) summary: Summary,
}

impl Replayer<MemoryStore<FakeClock>> {
    /// A replay of `policy` on the in-memory store (with the policy's key
    /// cap), its hot-key shard choices drawn from `seed`.
    pub(crate) fn new(policy: Policy, seed: u64) -> Self {
        let clock = FakeClock::new(Nanos::ZERO);
        let mut store = MemoryStore::with_clock(clock.clone());
        if let StoreConfig::Memory {
            max_keys: Some(max),
        } = policy.store()
        {
            store = store.with_max_keys(*max);
        }
        // A recorded run brought as many inline limits as its server kept,
        // which may be more than the default: an offline replay keeps all.
        let enforcer = Enforcer::new(policy, store)
            .with_seed(seed)
            .with_max_inline_limits(usize::MAX);
        Replayer::with_enforcer(enforcer, clock)
    }
}

impl<S: Store> Replayer<S> {
    /// A replay deciding with `enforcer`, whose store reads `clock`.
    pub(crate) fn with_enforcer(enforcer: Enforcer<S>, clock: FakeClock) -> Self {
        let policy = enforcer.policy();
        let summary = Summary::new(&policy);
        Replayer {
            enforcer,
            policy,
            clock,
            summary,
        }
    }

    /// The policy replayed.
    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The proxies whose forwarding headers name a request's client.
    pub(crate) fn trusted_proxies(&self) -> &TrustedProxies {
        self.policy.trusted_proxies()
    }

    /// Moves virtual time to `t` seconds.
    pub(crate) fn set_time(&self, t: f64) -> anyhow::Result<()> {
        let now =
            Nanos::from_secs_f64(t).ok_or_else(|| anyhow::anyhow!("`t` = {t} is out of range"))?;
        self.clock.set(now);
        Ok(())
    }

    /// A request, decided and counted.
    pub(crate) async fn request(&mut self, req: &RequestParts) -> Verdict {
        let verdict = self.enforcer.enforce(&self.policy, req).await;
        self.summary.verdict(&verdict);
        verdict
    }

    /// A call to a named limit, or to the limit it brings.
    pub(crate) async fn call<'a>(
        &'a mut self,
        t: &'a serde_json::Number,
        call: &'a Call,
    ) -> anyhow::Result<Line<'a>> {
        let Call {
            limit: name,
            key,
            count,
            reserve,
            settle,
            inline,
        } = call;
        let (key, count, reserve) = (key.as_str(), *count, *reserve);
        let brought;
        let named = match inline {
            None => match self.policy.named_limit(name) {
                Some(named) => named,
                None => anyhow::bail!("no limit named {name:?} in the policy"),
            },
            Some((algorithm, config)) => {
                brought = self
                    .enforcer
                    .inline_limit(&self.policy, name, algorithm, config)?;
                &*brought
            }
        };
        let mode = if reserve {
            Mode::RESERVE
        } else {
            Mode::CONSUME
        };
        let result = match settle {
            Some(change) => self.enforcer.settle_named(named, key, *change).await,
            None => self.enforcer.decide_named(named, key, count, mode).await,
        };
        let line = match result {
            // A refund admits nothing: it is no call to count.
            Ok(d) if matches!(settle, Some(Settle::Refund(_))) => Line::decided(t, name, &d, true),
            Ok(d) => {
                self.summary.call(name, key, count, &d);
                Line::decided(t, name, &d, d.allowed)
            }
            Err(StoreError::Cost(e)) => {
                let capacity = named.limit().algorithm().capacity();
                Line::refused(t, name, capacity, &e)
            }
            Err(e) => return Err(e.into()),
        };
        self.summary.event(line.allowed, true);
        Ok(line)
    }
}
