//! Decides replayed events with the engine every front end uses, on a store
//! whose clock is the events' virtual time, and keeps the run's totals.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use sluice_core::{Clock, FakeClock, MemoryStore, Mode, Nanos, Settle, Store, StoreError};
use sluice_engine::{Enforcer, HeldLease, Verdict};
use sluice_policy::{Policy, RequestParts, StoreConfig, TrustedProxies};

use super::event::{Call, Hold};
use super::line::Line;
use super::summary::Summary;

/// An enforcer whose store runs on virtual time, with the run's totals.
pub(crate) struct Replayer<S> {
    enforcer: Enforcer<S>,
    /// The enforcer's policy, taken once: a replay never reloads.
    policy: Arc<Policy>,
    clock: FakeClock,
    pub(crate) summary: Summary,
    /// Leases to release when virtual time reaches their time, in order
    /// (the second number, the count of leases held so far, keeps leases
    /// due at one time apart).
    due: BTreeMap<(Nanos, u64), HeldLease>,
    held: u64,
    /// Leases that calls named, for a later event to release: by limit,
    /// key and name.
    named: HashMap<(String, String, String), HeldLease>,
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

/// `t` seconds as nanoseconds, if in range.
fn secs(t: f64) -> anyhow::Result<Nanos> {
    Nanos::from_secs_f64(t).ok_or_else(|| anyhow::anyhow!("{t} s is out of range"))
}

impl<S: Store + 'static> Replayer<S> {
    /// A replay deciding with `enforcer`, whose store reads `clock`.
    pub(crate) fn with_enforcer(enforcer: Enforcer<S>, clock: FakeClock) -> Self {
        let policy = enforcer.policy();
        let summary = Summary::new(&policy);
        Replayer {
            enforcer,
            policy,
            clock,
            summary,
            due: BTreeMap::new(),
            held: 0,
            named: HashMap::new(),
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

    /// Moves virtual time to `t` seconds, releasing on the way, each at its
    /// own time, the leases whose holders are done by then.
    pub(crate) async fn set_time(&mut self, t: f64) -> anyhow::Result<()> {
        let now = secs(t)?;
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((at, _), held) = entry.remove_entry();
            self.clock.set(at.max(self.clock.now()));
            self.enforcer.release(&held).await?;
        }
        self.clock.set(now);
        Ok(())
    }

    /// Holds `held` for `duration` seconds from now.
    fn hold_for(&mut self, held: HeldLease, duration: f64) -> anyhow::Result<()> {
        let at = Nanos(self.clock.now().0.saturating_add(secs(duration)?.0));
        self.held += 1;
        self.due.insert((at, self.held), held);
        Ok(())
    }

    /// The release of the lease a call named `name` on `key` of `limit`.
    pub(crate) async fn release<'a>(
        &mut self,
        t: &'a serde_json::Number,
        limit: &'a str,
        key: &str,
        name: &str,
    ) -> anyhow::Result<Line<'a>> {
        let released = match self
            .named
            .remove(&(limit.to_owned(), key.to_owned(), name.to_owned()))
        {
            Some(held) => self.enforcer.release(&held).await?,
            None => false,
        };
        self.summary.event(true, true);
        Ok(Line::released(t, limit, released))
    }

    /// A request, decided and counted.
    pub(crate) async fn request(&mut self, req: &RequestParts, duration: f64) -> Verdict {
        let mut verdict = self.enforcer.enforce_with(&self.policy, req).await;
        self.summary.verdict(&verdict);
        for held in std::mem::take(&mut verdict.leases) {
            // A duration is finite and ≥ 0, so always in range.
            let _ = self.hold_for(held, duration);
        }
        verdict
    }

    /// A request decided as a front end that can hold it decides it
    /// ([`Enforcer::enforce_shaped`]), and counted. What it reserved stays
    /// spent: a replay does not wait, its caller takes the request as
    /// forwarded once the verdict's `delay` is over.
    pub(crate) async fn request_shaped(&mut self, req: &RequestParts) -> Verdict {
        let verdict = self.enforcer.enforce_shaped_with(&self.policy, req).await;
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
            hold,
            inline,
        } = call;
        let (key, count, reserve) = (key.as_str(), *count, *reserve);
        let brought;
        let policy = Arc::clone(&self.policy);
        let named = match inline {
            None => match policy.named_limit(name) {
                Some(named) => named,
                None => anyhow::bail!("no limit named {name:?} in the policy"),
            },
            Some((algorithm, config)) => {
                brought = self
                    .enforcer
                    .inline_limit(&policy, name, algorithm, config)?;
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
            None if named.limit().takes_leases() && !reserve => {
                match self.enforcer.acquire_named(named, key, count).await {
                    Ok((d, Some(held))) => {
                        match hold {
                            Hold::Expiry => {}
                            Hold::For(duration) => self.hold_for(held, *duration)?,
                            Hold::Named(lease) => {
                                let id = (name.clone(), key.to_owned(), lease.clone());
                                if self.named.contains_key(&id) {
                                    // Given back, so that the run can go on
                                    // as the caller will fix it.
                                    self.enforcer.release(&held).await?;
                                    anyhow::bail!(
                                        "lease {lease:?} of {name:?} for key {key:?} is held \
                                         already: name each lease held at once apart"
                                    );
                                }
                                self.named.insert(id, held);
                            }
                        }
                        Ok(d.decision)
                    }
                    Ok((d, None)) => Ok(d.decision),
                    Err(e) => Err(e),
                }
            }
            None => self
                .enforcer
                .decide_named(named, key, count, mode)
                .await
                .map(|d| d.decision),
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
