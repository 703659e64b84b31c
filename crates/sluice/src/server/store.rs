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

impl<C: Clock + Send + Sync + 'static> Store for AnyStore<C> {
    async fn transact(&self, ops: &[Op<'_>], mode: Mode) -> Result<Outcome, StoreError> {
        match self {
            AnyStore::Memory(m) => m.transact_now(ops, mode),
            AnyStore::Redis(r) => r.transact(ops, mode).await,
        }
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => {
                m.reset_now(limit, key);
                Ok(())
            }
            AnyStore::Redis(r) => r.reset(limit, key).await,
        }
    }

    async fn value(&self, limit: &Limit, key: &str) -> Result<Value, StoreError> {
        match self {
            AnyStore::Memory(m) => Ok(m.value_now(limit, key)),
            AnyStore::Redis(r) => r.value(limit, key).await,
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
            AnyStore::Redis(r) => r.settle(limit, key, change).await,
        }
    }

    async fn release(&self, limit: &Limit, key: &str, id: u64) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(m) => Ok(m.release_now(limit, key, id)),
            AnyStore::Redis(r) => r.release(limit, key, id).await,
        }
    }
}
