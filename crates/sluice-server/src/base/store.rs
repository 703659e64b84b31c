//! The store a server runs on, chosen at start-up: in memory, Redis or
//! PostgreSQL.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{
    Clock, Decision, Limit, MemoryStore, Mode, Op, Outcome, Settle, Store, StoreError, SystemClock,
    Value,
};
use sluice_engine::Enforcer;
use sluice_policy::StoreConfig;
use sluice_postgres::{PostgresConfig, PostgresStats, PostgresStore};
use sluice_redis::{RedisConfig, RedisStats, RedisStore};

/// Either store, behind the one [`Store`] trait. The memory store's clock
/// is a parameter so that tests can run the server in virtual time.
pub enum AnyStore<C = SystemClock> {
    /// The embedded store.
    Memory(MemoryStore<C>),
    /// A Redis server or cluster.
    Redis(RedisStore),
    /// A PostgreSQL database; boxed, since its handle is several times
    /// the others' size.
    Postgres(Box<PostgresStore>),
}

/// The store that `--store` (when given) or the policy names, before it is
/// opened; shown as the log names it, a Redis URL with its password masked.
pub struct StoreChoice<'a> {
    kind: Kind<'a>,
    /// Chosen by `--store` (or `SLUICE_STORE`) over the policy.
    by_flag: bool,
}

enum Kind<'a> {
    Memory(Option<usize>),
    Redis(&'a str, Option<Duration>),
    Postgres(Box<PostgresConfig>),
}

impl<'a> StoreChoice<'a> {
    /// What `flag`, when given, or else `policy` chooses; `timeout`, when
    /// given, over the timeout the policy gives its store.
    pub fn of(
        flag: Option<&'a str>,
        timeout: Option<Duration>,
        policy: &'a StoreConfig,
    ) -> anyhow::Result<Self> {
        let postgres =
            |url: &str| url.starts_with("postgres://") || url.starts_with("postgresql://");
        let kind = match flag {
            Some("memory") => Kind::Memory(None),
            Some(url) if postgres(url) => Kind::Postgres(Box::new(PostgresConfig::from_url(url)?)),
            Some(url) => Kind::Redis(url, None),
            None => match policy {
                StoreConfig::Memory { max_keys } => Kind::Memory(*max_keys),
                StoreConfig::Redis { url, timeout } => Kind::Redis(url, *timeout),
                StoreConfig::Postgres {
                    url,
                    timeout,
                    schema,
                    durable,
                } => {
                    let mut config = PostgresConfig::from_url(url)?.with_durable(*durable);
                    if let Some(t) = timeout {
                        config = config.with_timeout(*t);
                    }
                    if let Some(s) = schema {
                        config = config.with_schema(s)?;
                    }
                    Kind::Postgres(Box::new(config))
                }
                _ => anyhow::bail!("the policy names a store this build cannot open"),
            },
        };
        let kind = match (kind, timeout) {
            (kind, None) => kind,
            (Kind::Memory(_), Some(_)) => {
                anyhow::bail!("--store-timeout is for a Redis or PostgreSQL store; memory has none")
            }
            (Kind::Redis(url, _), Some(t)) => Kind::Redis(url, Some(t)),
            (Kind::Postgres(config), Some(t)) => Kind::Postgres(Box::new(config.with_timeout(t))),
        };
        Ok(StoreChoice {
            kind,
            by_flag: flag.is_some(),
        })
    }
}

impl StoreChoice<'_> {
    /// The database, when the choice is PostgreSQL.
    pub fn postgres(&self) -> Option<&PostgresConfig> {
        match &self.kind {
            Kind::Postgres(config) => Some(config),
            Kind::Memory(_) | Kind::Redis(..) => None,
        }
    }
}

impl fmt::Display for StoreChoice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Memory(None) => f.write_str("memory")?,
            Kind::Memory(Some(max)) => write!(f, "memory, at most {max} keys")?,
            Kind::Redis(url, None) => f.write_str(&sluice_redis::mask_password(url))?,
            Kind::Redis(url, Some(t)) => write!(
                f,
                "{}, calls time out after {t:?}",
                sluice_redis::mask_password(url)
            )?,
            Kind::Postgres(ref config) => {
                write!(f, "{config}, calls time out after {:?}", config.timeout())?;
            }
        }
        if self.by_flag {
            f.write_str(" (from --store)")?;
        }
        Ok(())
    }
}

impl AnyStore<SystemClock> {
    /// Opens the store that `--store` (when given) or the policy names.
    /// A Redis store opens even while Redis is down; `/readyz` says so.
    pub fn open(flag: Option<&str>, policy: &StoreConfig) -> anyhow::Result<Self> {
        Self::open_choice(&StoreChoice::of(flag, None, policy)?)
    }

    /// Opens the store `choice` names.
    pub(crate) fn open_choice(choice: &StoreChoice<'_>) -> anyhow::Result<Self> {
        match choice.kind {
            Kind::Memory(max) => {
                let store = MemoryStore::new();
                Ok(AnyStore::Memory(match max {
                    Some(m) => store.with_max_keys(m),
                    None => store,
                }))
            }
            Kind::Redis(url, timeout) => {
                let mut config = RedisConfig::from_url(url)?;
                if let Some(t) = timeout {
                    config = config.with_timeout(t);
                }
                Ok(AnyStore::Redis(RedisStore::new(config)?))
            }
            Kind::Postgres(ref config) => Ok(AnyStore::Postgres(Box::new(PostgresStore::new(
                (**config).clone(),
            )?))),
        }
    }
}

/// How long a store has from start-up to answer before the log says, as
/// an error, that it does not.
const FIRST_ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// How often readiness is looked at meanwhile; the store pings on its own.
const LOOK_EVERY: Duration = Duration::from_millis(25);

/// Watches for the first answer of the store `enforcer` runs on, named
/// `name` in the log. When none comes within [`FIRST_ANSWER_WITHIN`] of
/// start-up, an error says so (the server serves on, each rule as its
/// `on_store_error` says, `/readyz` answering 503); and once it answers,
/// the log says that too.
pub(crate) fn report_first_answer(enforcer: &Arc<Enforcer<AnyStore>>, name: String) {
    let enforcer = Arc::clone(enforcer);
    tokio::spawn(async move {
        let store = enforcer.store();
        let answered = async {
            while !store.is_ready() {
                tokio::time::sleep(LOOK_EVERY).await;
            }
        };
        tokio::pin!(answered);
        if tokio::time::timeout(FIRST_ANSWER_WITHIN, &mut answered)
            .await
            .is_ok()
        {
            return;
        }
        tracing::error!(
            store = %name,
            within = ?FIRST_ANSWER_WITHIN,
            "the store is not answering; decisions follow each rule's on_store_error and \
             /readyz answers 503 until it does"
        );
        answered.await;
        tracing::info!(store = %name, "the store answers");
    });
}

impl<C: Clock> AnyStore<C> {
    /// Whether the store can answer now.
    pub fn is_ready(&self) -> bool {
        match self {
            AnyStore::Memory(_) => true,
            AnyStore::Redis(r) => r.is_ready(),
            AnyStore::Postgres(p) => p.is_ready(),
        }
    }

    /// What the Redis store has done, for its metrics; `None` in memory.
    pub fn redis_stats(&self) -> Option<RedisStats> {
        match self {
            AnyStore::Memory(_) | AnyStore::Postgres(_) => None,
            AnyStore::Redis(r) => Some(r.stats()),
        }
    }

    /// What the PostgreSQL store has done, for its metrics; `None` on the
    /// other stores.
    pub fn postgres_stats(&self) -> Option<PostgresStats> {
        match self {
            AnyStore::Memory(_) | AnyStore::Redis(_) => None,
            AnyStore::Postgres(p) => Some(p.stats()),
        }
    }

    /// Keys held in process, for the `sluice_keys` gauge (Redis keeps its
    /// own count).
    pub fn keys_held(&self) -> Option<usize> {
        match self {
            AnyStore::Memory(m) => Some(m.len()),
            AnyStore::Redis(_) | AnyStore::Postgres(_) => None,
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
            AnyStore::Postgres(p) => Box::pin(p.transact(ops, mode)).await,
        }
    }

    async fn reset(&self, limit: &Limit, key: &str) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(m) => {
                m.reset_now(limit, key);
                Ok(())
            }
            AnyStore::Redis(r) => Box::pin(r.reset(limit, key)).await,
            AnyStore::Postgres(p) => Box::pin(p.reset(limit, key)).await,
        }
    }

    async fn value(&self, limit: &Limit, key: &str) -> Result<Value, StoreError> {
        match self {
            AnyStore::Memory(m) => Ok(m.value_now(limit, key)),
            AnyStore::Redis(r) => Box::pin(r.value(limit, key)).await,
            AnyStore::Postgres(p) => Box::pin(p.value(limit, key)).await,
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
            AnyStore::Postgres(p) => Box::pin(p.settle(limit, key, change)).await,
        }
    }

    async fn release(&self, limit: &Limit, key: &str, id: u64) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(m) => Ok(m.release_now(limit, key, id)),
            AnyStore::Redis(r) => Box::pin(r.release(limit, key, id)).await,
            AnyStore::Postgres(p) => Box::pin(p.release(limit, key, id)).await,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
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
        let decide = size_of_val(&enforcer.enforce_hits(&hits));
        assert!(decide <= 768, "{decide} bytes");
    }

    #[test]
    fn the_store_timeout_flag_overrides_the_policys_and_is_refused_for_memory() {
        let policy = StoreConfig::Redis {
            url: "redis://:secret@db:6379".into(),
            timeout: Some(Duration::from_millis(50)),
        };
        let choice = StoreChoice::of(None, Some(Duration::from_secs(2)), &policy).unwrap();
        assert_eq!(
            choice.to_string(),
            "redis://:***@db:6379, calls time out after 2s"
        );
        let choice = StoreChoice::of(
            Some("redis://db"),
            Some(Duration::from_millis(300)),
            &policy,
        );
        assert!(matches!(
            choice.unwrap().kind,
            Kind::Redis("redis://db", Some(t)) if t == Duration::from_millis(300)
        ));
        let pg = StoreChoice::of(
            Some("postgres://u@db/d"),
            Some(Duration::from_secs(1)),
            &policy,
        );
        assert_eq!(
            pg.unwrap().postgres().unwrap().timeout(),
            Duration::from_secs(1)
        );
        let memory = StoreConfig::Memory { max_keys: None };
        let refused = StoreChoice::of(None, Some(Duration::from_secs(1)), &memory)
            .err()
            .unwrap();
        assert!(refused.to_string().contains("memory has none"), "{refused}");
        assert!(StoreChoice::of(Some("memory"), Some(Duration::from_secs(1)), &policy).is_err());
    }
}
