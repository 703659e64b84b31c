//! The store a server runs on, chosen at start-up: in memory or Redis.

use sluice_core::{
    Clock, Decision, Limit, MemoryStore, Mode, Op, Outcome, Settle, Store, StoreError, SystemClock,
    Value,
};
use sluice_policy::StoreConfig;
use sluice_redis::{RedisConfig, RedisStats, RedisStore};

/// Either store, behind the one [`Store`] trait. The memory store's clock
/// is a parameter so that tests can run the server in virtual time.
pub enum AnyStore<C = SystemClock> {
    /// The embedded store.
    Memory(MemoryStore<C>),
    /// A Redis server or cluster.
    Redis(RedisStore),
}

impl AnyStore<SystemClock> {
    /// Opens the store that `--store` (when given) or the policy names.
    /// A Redis store opens even while Redis is down; `/readyz` says so.
    pub fn open(flag: Option<&str>, policy: &StoreConfig) -> anyhow::Result<Self> {
        let memory = |max: Option<usize>| {
            let store = MemoryStore::new();
            AnyStore::Memory(match max {
                Some(m) => store.with_max_keys(m),
                None => store,
            })
        };
        let redis = |url: &str, timeout| -> anyhow::Result<Self> {
            let mut config = RedisConfig::from_url(url)?;
            if let Some(t) = timeout {
                config = config.with_timeout(t);
            }
            Ok(AnyStore::Redis(RedisStore::new(config)?))
        };
        match flag {
            Some("memory") => Ok(memory(None)),
            Some(url) => redis(url, None),
            None => match policy {
                StoreConfig::Memory { max_keys } => Ok(memory(*max_keys)),
                StoreConfig::Redis { url, timeout } => redis(url, *timeout),
                _ => anyhow::bail!("the policy names a store this build cannot open"),
            },
        }
    }
}

impl<C: Clock> AnyStore<C> {
    /// Whether the store can answer now.
    pub fn is_ready(&self) -> bool {
        match self {
            AnyStore::Memory(_) => true,
            AnyStore::Redis(r) => r.is_ready(),
        }
    }

    /// What the Redis store has done, for its metrics; `None` in memory.
    pub fn redis_stats(&self) -> Option<RedisStats> {
        match self {
            AnyStore::Memory(_) => None,
            AnyStore::Redis(r) => Some(r.stats()),
        }
    }

    /// Keys held in process, for the `sluice_keys` gauge (Redis keeps its
    /// own count).
    pub fn keys_held(&self) -> Option<usize> {
        match self {
            AnyStore::Memory(m) => Some(m.len()),
            AnyStore::Redis(_) => None,
        }
    }
}

// A Redis call's future is boxed. Unboxed, it would make every call's
// future as large as Redis's, and every request's with it, to be moved into
// a box on each request even when the store is in memory. A Redis call
// waits on the network, next to which one allocation is nothing.
impl<C: Clock + Send + Sync + 'static> Store for AnyStore<C> {
    async fn transact(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        match self {
            AnyStore::Memory(m) => m.transact_now(ops, mode),
            AnyStore::Redis(r) => Box::pin(r.transact(ops, mode)).await,
        }
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => {
                m.reset_now(limit, key);
                Ok(())
            }
            AnyStore::Redis(r) => Box::pin(r.reset(limit, key)).await,
        }
    }

    async fn value(&self, limit: &Limit, key: &str) -> Result<Value, StoreError> {
        match self {
            AnyStore::Memory(m) => Ok(m.value_now(limit, key)),
            AnyStore::Redis(r) => Box::pin(r.value(limit, key)).await,
        }
    }

    async fn settle(
        &self,
        limit: &Limit,
        key: &str,
        change: Settle,
    ) -> Result<Decision, StoreError> {
        match self {
            AnyStore::Memory(m) => m.settle_now(limit, key, change),
            AnyStore::Redis(r) => Box::pin(r.settle(limit, key, change)).await,
        }
    }

    async fn release(&self, limit: &Limit, key: &str, id: u64) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(m) => Ok(m.release_now(limit, key, id)),
            AnyStore::Redis(r) => Box::pin(r.release(limit, key, id)).await,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sluice_engine::Enforcer;
    use sluice_policy::{Policy, RuleHit};

    // Every request's future holds a store call's and a decision's, and is
    // moved into a box with each request. A future's size is its type's, so
    // a memory store's calls answer for the Redis variant's too.
    #[test]
    fn a_store_calls_future_and_a_decisions_stay_small_whatever_the_store() {
        let store = AnyStore::Memory(MemoryStore::new());
        let limit = Limit::new("l", sluice_core::TokenBucket::new(1.0, 1.0).unwrap());
        let transact = size_of_val(&store.transact(&[], Mode::CONSUME));
        assert!(transact <= 64, "{transact} bytes");
        let settle = size_of_val(&store.settle(&limit, "k", Settle::Refund(1.0)));
        assert!(settle <= 64, "{settle} bytes");
        let release = size_of_val(&store.release(&limit, "k", 1));
        assert!(release <= 64, "{release} bytes");
        let enforcer = Enforcer::new(Policy::default(), store);
        let hits: [RuleHit<'_>; 0] = [];
        let decide = size_of_val(&enforcer.decide(&hits));
        assert!(decide <= 768, "{decide} bytes");
    }
}
