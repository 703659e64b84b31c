//! Resets made anywhere reach every server's deny cache.
//!
//! The deny cache (see `cache`) holds upper bounds on keys' tokens, which
//! only holds while tokens come back with time alone. A reset breaks that, so
//! every reset, by any store sharing the Redis, deletes the key's state and
//! PUBLISHes the limit's name and the key on the channel `<prefix>resets`,
//! in one script call: one round trip, and no moment when the key is reset
//! but the message not yet sent. On a Cluster the script runs on the key's
//! node, and PUBLISH is broadcast over the cluster bus to every node's
//! subscribers.
//!
//! Every store with a deny cache subscribes to that channel on a connection
//! of its own (on a Cluster, to one seed node at a time; any node hears every
//! PUBLISH) and forgets each key it hears of, as it does for its own resets.
//! The cache is only trusted while the subscription stands: before the first
//! SUBSCRIBE is confirmed, and from a dropped connection (or an unanswered
//! keepalive PING) until the next confirmed SUBSCRIBE, it denies nothing and
//! learns nothing; each new subscription clears it, since resets may have
//! been missed meanwhile. The subscriber reconnects with backoff, and stops
//! when the store is dropped.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSub;
use redis::{Cmd, Msg, RedisError, Value};
use sluice_core::Clock;
use tokio::sync::oneshot;

use crate::cache::DenyCache;
use crate::config::RedisConfig;

/// Deletes one key's state (every shard, all in one Cluster slot) and
/// announces it. PUBLISH is protected so that a user without permission on
/// the channel can still reset: then no store sharing that user can
/// subscribe either, so none trusts its deny cache. The reply is the number
/// of receivers, or the error's text.
const RESET_SCRIPT: &str = r"
for _, key in ipairs(KEYS) do
  redis.call('DEL', key)
end
local sent = redis.pcall('PUBLISH', ARGV[1], ARGV[2])
if type(sent) == 'table' and sent.err then
  return sent.err
end
return sent
";

/// The first retry after a failed connection comes this soon; each failure
/// doubles the wait, up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// The longest wait between two attempts to subscribe.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How often an idle subscription is checked with a PING, so a connection
/// that died without closing (a lost peer, a partition) is noticed.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// The shortest deadline for connecting, subscribing and each keepalive
/// PING: nothing waits on the subscriber, so it may take longer than a
/// decision, but never forever.
const MIN_DEADLINE: Duration = Duration::from_millis(500);

/// The channel resets are announced on, for keys under `prefix`.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}resets")
}

/// The message announcing a reset of `key` under the limit `limit`:
/// `<limit length in bytes>:<limit><key>`. The receivers' fingerprints are
/// salted per process, so the message carries the names, not a hash; the
/// length makes it unambiguous whatever the names contain.
pub(crate) fn message(limit: &str, key: &str) -> Vec<u8> {
    format!("{}:{limit}{key}", limit.len()).into_bytes()
}

/// The limit and key a message names, or `None` if it is not one of ours.
fn parse(payload: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (len, rest) = text.split_once(':')?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: usize = len.parse().ok()?;
    if !rest.is_char_boundary(len) {
        return None;
    }
    Some(rest.split_at(len))
}

/// The script call that resets the state keys `keys` and announces it.
pub(crate) fn reset_command(keys: &[String], channel: &str, message: &[u8]) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(RESET_SCRIPT).arg(keys.len()).arg(keys);
    cmd.arg(channel).arg(message);
    cmd
}

/// Whether a reset's announcement went out, from the script's reply: the
/// number of receivers, or why PUBLISH failed.
pub(crate) fn announced(reply: &Value) -> Result<(), String> {
    match reply {
        Value::Int(_) => Ok(()),
        Value::BulkString(b) => Err(String::from_utf8_lossy(b).into_owned()),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// The deny cache and the subscription that keeps it true; shared by the
/// store and its subscriber task, which only holds it weakly.
pub(crate) struct SyncedCache {
    cache: DenyCache,
    /// Whether the subscription stands, so that no reset can go unheard.
    subscribed: AtomicBool,
    /// Announcements applied.
    pub(crate) invalidations: AtomicU64,
    /// Confirmed subscriptions, each of which cleared the cache.
    pub(crate) subscribes: AtomicU64,
    /// Subscriptions lost.
    pub(crate) losses: AtomicU64,
    /// Dropped with the cache, which tells the subscriber to stop at once,
    /// even while it waits on Redis.
    _stop: oneshot::Sender<Infallible>,
}

impl SyncedCache {
    /// Wraps `cache` and starts its subscriber on `runtime`: nothing here
    /// waits for Redis.
    pub(crate) fn start(
        cache: DenyCache,
        config: &RedisConfig,
        clock: Arc<dyn Clock>,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Arc<SyncedCache>, RedisError> {
        let clients = config
            .nodes()
            .iter()
            .map(|node| redis::Client::open(node.as_str()))
            .collect::<Result<Vec<_>, _>>()?;
        let (stop, stopped) = oneshot::channel();
        let synced = Arc::new(SyncedCache {
            cache,
            subscribed: AtomicBool::new(false),
            invalidations: AtomicU64::new(0),
            subscribes: AtomicU64::new(0),
            losses: AtomicU64::new(0),
            _stop: stop,
        });
        let subscriber = Subscriber {
            synced: Arc::downgrade(&synced),
            clients,
            channel: channel(config.prefix()),
            clock,
            deadline: config.timeout().max(MIN_DEADLINE),
        };
        runtime.spawn(subscriber.run(stopped));
        Ok(synced)
    }

    /// The cache, for forgetting: always safe.
    pub(crate) fn cache(&self) -> &DenyCache {
        &self.cache
    }

    /// The cache, for denying and learning: only while subscribed.
    pub(crate) fn trusted(&self) -> Option<&DenyCache> {
        self.subscribed
            .load(Ordering::Acquire)
            .then_some(&self.cache)
    }

    /// Applies one message from the channel at local time `now`.
    fn apply(&self, msg: &Msg, now: sluice_core::Nanos) {
        match parse(msg.get_payload_bytes()) {
            Some((limit, key)) => {
                // Only shard 0 of an unsharded limit is ever cached.
                self.cache
                    .forget(self.cache.fingerprint(limit, key, 0), now);
            }
            None => {
                // Someone reset something under our prefix that we cannot
                // name: forgetting everything is always safe.
                tracing::warn!(
                    channel = msg.get_channel_name(),
                    "unreadable reset announcement; clearing the deny cache"
                );
                self.cache.clear(now);
            }
        }
        self.invalidations.fetch_add(1, Ordering::Relaxed);
    }
}

/// Why a subscription ended.
enum End {
    /// The store is gone.
    Stop,
    /// The connection failed; the text says how.
    Lost(String),
}

/// The task that keeps the subscription.
struct Subscriber {
    synced: Weak<SyncedCache>,
    /// One client per seed node, tried in turn.
    clients: Vec<redis::Client>,
    channel: String,
    clock: Arc<dyn Clock>,
    /// The deadline of connecting, subscribing and each PING.
    deadline: Duration,
}

impl Subscriber {
    async fn run(self, mut stop: oneshot::Receiver<Infallible>) {
        let mut backoff = MIN_BACKOFF;
        let mut next = 0;
        // Failed attempts since the last subscription: only the first of a
        // streak is worth a warning.
        let mut failures = 0u64;
        loop {
            let Some(client) = self.clients.get(next) else {
                return;
            };
            next = (next + 1) % self.clients.len();
            let attempt = tokio::select! {
                biased;
                _ = &mut stop => return,
                r = tokio::time::timeout(self.deadline, self.subscribe(client)) => r,
            };
            let pubsub = match attempt {
                Ok(Ok(pubsub)) => pubsub,
                Ok(Err(e)) => {
                    self.failed(&mut failures, &e.to_string());
                    if !self.pause(&mut stop, &mut backoff).await {
                        return;
                    }
                    continue;
                }
                Err(_) => {
                    self.failed(&mut failures, "timed out");
                    if !self.pause(&mut stop, &mut backoff).await {
                        return;
                    }
                    continue;
                }
            };
            failures = 0;
            backoff = MIN_BACKOFF;
            {
                let Some(synced) = self.synced.upgrade() else {
                    return;
                };
                // Resets announced before SUBSCRIBE took effect went unheard:
                // forget everything, and every reply to a request sent before
                // now. Then trust the cache again.
                synced.cache.clear(self.clock.now());
                synced.subscribed.store(true, Ordering::Release);
                synced.subscribes.fetch_add(1, Ordering::Relaxed);
            }
            tracing::debug!(channel = self.channel, "subscribed to reset announcements");
            let end = self.listen(pubsub, &mut stop).await;
            let Some(synced) = self.synced.upgrade() else {
                return;
            };
            synced.subscribed.store(false, Ordering::Release);
            synced.losses.fetch_add(1, Ordering::Relaxed);
            drop(synced);
            match end {
                End::Stop => return,
                End::Lost(why) => tracing::warn!(
                    channel = self.channel,
                    error = why,
                    "lost the subscription to reset announcements; the deny cache is off until \
                     it is back"
                ),
            }
            if !self.pause(&mut stop, &mut backoff).await {
                return;
            }
        }
    }

    /// Connects to one node and subscribes; `Ok` once SUBSCRIBE is confirmed.
    async fn subscribe(&self, client: &redis::Client) -> Result<PubSub, RedisError> {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(&self.channel).await?;
        Ok(pubsub)
    }

    fn failed(&self, failures: &mut u64, why: &str) {
        if *failures == 0 {
            tracing::warn!(
                channel = self.channel,
                error = why,
                "cannot subscribe to reset announcements; the deny cache is off until it can"
            );
        } else {
            tracing::debug!(
                channel = self.channel,
                error = why,
                "still cannot subscribe"
            );
        }
        *failures += 1;
    }

    /// Waits out the backoff and doubles it; `false` if the store is gone.
    async fn pause(
        &self,
        stop: &mut oneshot::Receiver<Infallible>,
        backoff: &mut Duration,
    ) -> bool {
        let wait = *backoff;
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
        tokio::select! {
            biased;
            _ = stop => false,
            () = tokio::time::sleep(wait) => self.synced.strong_count() > 0,
        }
    }

    /// Applies messages until the connection fails or the store is gone.
    async fn listen(&self, pubsub: PubSub, stop: &mut oneshot::Receiver<Infallible>) -> End {
        let (mut sink, mut stream) = pubsub.split();
        let mut keepalive =
            tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = &mut *stop => return End::Stop,
                msg = stream.next() => {
                    let Some(msg) = msg else {
                        return End::Lost("the connection closed".into());
                    };
                    if msg.get_channel_name() != self.channel {
                        continue;
                    }
                    let Some(synced) = self.synced.upgrade() else {
                        return End::Stop;
                    };
                    synced.apply(&msg, self.clock.now());
                }
                _ = keepalive.tick() => {
                    let ping = tokio::time::timeout(self.deadline, sink.ping::<Value>());
                    match ping.await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return End::Lost(e.to_string()),
                        Err(_) => return End::Lost("a keepalive PING timed out".into()),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_any_limit_and_key_unambiguously() {
        for (limit, key) in [
            ("api", "user-1"),
            ("a:b", ":c"),
            ("", "k"),
            ("l", ""),
            ("ünï", "ключ:{x}\\"),
            ("12:ab", "3:c"),
        ] {
            assert_eq!(parse(&message(limit, key)), Some((limit, key)));
        }
        assert_ne!(message("a:b", "c"), message("a", "b:c"));
    }

    #[test]
    fn foreign_messages_are_not_misread() {
        for bad in [
            &b""[..],
            b"hello",
            b":abc",
            b"x:abc",
            b"+1:abc",
            b"9:abc",
            b"99999999999999999999999:a",
            b"2:\xff\xfe",
            "1:ü".as_bytes(),
        ] {
            assert_eq!(parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
