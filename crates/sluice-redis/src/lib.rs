//! A Redis (and Redis Cluster, and Valkey) implementation of
//! [`sluice_core::Store`], so that every server sharing one Redis shares one
//! exact limit.
//!
//! Every algorithm of [`sluice_core`] runs here: token buckets, fixed
//! windows, sliding windows and sliding logs, in one Lua script that
//! decides a whole transaction atomically on Redis's clock.
//!
//! Denials that Redis's last reply already proves are answered locally, from
//! a deny cache (token buckets only: theirs is the one state whose last
//! reading bounds what it holds later). A reset by any store sharing the Redis invalidates it
//! everywhere: the reset is announced on the pub/sub channel
//! `<prefix>resets` (in one script call with the delete), every store with
//! a deny cache listens to it, and a store that is not subscribed (starting
//! up, or after its connection dropped, until it has re-subscribed and
//! cleared the cache) denies nothing locally. So the cache only works when
//! the Redis user may use that channel.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use sluice_core::{Limit, Mode, Op, Store, TokenBucket};
//! use sluice_redis::{RedisConfig, RedisStore};
//! let store = RedisStore::new(RedisConfig::from_url("redis://127.0.0.1:6379/0")?)?;
//! let limit = Limit::new("api", TokenBucket::new(50.0, 20.0)?);
//! let outcome = store.transact(&[Op::new(&limit, "user-1", 1.0)], Mode::CONSUME).await?;
//! println!("allowed: {}", outcome.allowed);
//! # Ok(()) }
//! ```

mod cache;
mod config;
mod keys;
mod resets;
mod script;
mod seen;
mod store;

pub use config::{RedisConfig, RedisConfigError, mask_password};
#[doc(hidden)]
pub use script::LUA_FILES;
pub use store::{NewError, RedisStats, RedisStore};
