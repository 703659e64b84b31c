//! How to reach Redis and how to talk to it: parsed from one URL, tuned with
//! builder methods.

use std::time::Duration;

use redis::IntoConnectionInfo;

/// A configuration that cannot work, found before connecting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// The URL does not parse, or names an unknown scheme.
    #[error("invalid Redis URL {url:?}: {reason}")]
    Url {
        /// The URL as given, with any password masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Where Redis is and how the store uses it.
///
/// URLs:
/// - `redis://[user:password@]host[:port][/db]`, or `rediss://` for TLS;
/// - `redis+cluster://[user:password@]host:port,host:port,...` (or
///   `rediss+cluster://`) for Redis Cluster, listing any number of seed nodes.
///
/// ```
/// use std::time::Duration;
/// use sluice_redis::RedisConfig;
/// let c = RedisConfig::from_url("redis://:secret@127.0.0.1:6379/2").unwrap();
/// assert!(!c.is_cluster());
/// assert_eq!(c.timeout(), Duration::from_millis(50));
/// let c = RedisConfig::from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").unwrap();
/// assert!(c.is_cluster());
/// assert_eq!(c.nodes().len(), 2);
/// assert!(RedisConfig::from_url("http://nope").is_err());
/// ```
#[derive(Debug, Clone)]
pub struct RedisConfig {
    nodes: Vec<String>,
    cluster: bool,
    timeout: Duration,
    prefix: String,
    max_batch: usize,
    max_in_flight: usize,
    deny_cache: usize,
}

impl RedisConfig {
    /// Parses a Redis URL (see the type's documentation).
    pub fn from_url(url: &str) -> Result<Self, RedisConfigError> {
        let err = |reason: &str| RedisConfigError::Url {
            url: mask_password(url),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| err("missing scheme"))?;
        let (base, cluster) = match scheme {
            "redis" | "rediss" | "valkey" | "valkeys" => (scheme, false),
            "redis+cluster" => ("redis", true),
            "rediss+cluster" => ("rediss", true),
            _ => {
                return Err(err(
                    "the scheme must be redis, rediss, redis+cluster or rediss+cluster",
                ));
            }
        };
        let nodes: Vec<String> = if cluster {
            // The user info, if any, applies to every seed node.
            let (auth, hosts) = match rest.rsplit_once('@') {
                Some((auth, hosts)) => (format!("{auth}@"), hosts),
                None => (String::new(), rest),
            };
            hosts
                .trim_end_matches('/')
                .split(',')
                .filter(|h| !h.is_empty())
                .map(|h| format!("{base}://{auth}{h}"))
                .collect()
        } else {
            vec![url.to_owned()]
        };
        if nodes.is_empty() {
            return Err(err("no host"));
        }
        for node in &nodes {
            node.as_str()
                .into_connection_info()
                .map_err(|e| err(&e.to_string()))?;
        }
        Ok(RedisConfig {
            nodes,
            cluster,
            timeout: Duration::from_millis(50),
            prefix: "sluice:".to_owned(),
            max_batch: 256,
            // Measured on the store benchmark: a few calls keep Redis busy
            // while replies are handled; more make smaller batches, which
            // cost Redis (and this process) more per decision.
            max_in_flight: 3,
            deny_cache: 1 << 14,
        })
    }

    /// Sets the deadline of every call, queueing included (default 50 ms).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use sluice_redis::RedisConfig;
    /// let c = RedisConfig::from_url("redis://localhost").unwrap().with_timeout(Duration::from_millis(20));
    /// assert_eq!(c.timeout(), Duration::from_millis(20));
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the prefix of every key the store writes (default `sluice:`), and
    /// of the pub/sub channel resets are announced on (`<prefix>resets`).
    ///
    /// ```
    /// # use sluice_redis::RedisConfig;
    /// let c = RedisConfig::from_url("redis://localhost").unwrap().with_prefix("rl:");
    /// assert_eq!(c.prefix(), "rl:");
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the most transactions one script call decides (default 256), and
    /// how many script calls may be in flight at once (default 3). While all
    /// are in flight, new decisions queue and leave together in the next.
    ///
    /// ```
    /// # use sluice_redis::RedisConfig;
    /// let c = RedisConfig::from_url("redis://localhost").unwrap().with_batching(1, 64);
    /// assert_eq!(c.max_batch(), 1);
    /// ```
    pub fn with_batching(mut self, max_batch: usize, max_in_flight: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self.max_in_flight = max_in_flight.max(1);
        self
    }

    /// Sets the number of slots in the local deny cache (default 16384);
    /// 0 turns it off.
    ///
    /// With the cache on, the store also keeps one pub/sub connection
    /// subscribed to resets announced on `<prefix>resets` (to the first
    /// reachable seed node on a Cluster); the cache only denies while that
    /// subscription stands.
    ///
    /// ```
    /// # use sluice_redis::RedisConfig;
    /// let c = RedisConfig::from_url("redis://localhost").unwrap().with_deny_cache(0);
    /// assert_eq!(c.deny_cache(), 0);
    /// ```
    pub fn with_deny_cache(mut self, slots: usize) -> Self {
        self.deny_cache = slots;
        self
    }

    /// The node URLs: one, or the cluster's seeds.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Whether the URL named a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The deadline of every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The prefix of every key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The most transactions in one script call.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The most script calls in flight.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// The deny cache's size in slots; 0 is off.
    pub fn deny_cache(&self) -> usize {
        self.deny_cache
    }
}

/// The URL with the password, if any, replaced by `***`, for error messages
/// and logs.
///
/// ```
/// use sluice_redis::mask_password;
/// assert_eq!(mask_password("redis://u:hunter2@h:6379/1"), "redis://u:***@h:6379/1");
/// assert_eq!(mask_password("redis://h:6379"), "redis://h:6379");
/// ```
pub fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((auth, host)) => match auth.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_seeds_share_the_credentials() {
        let c = RedisConfig::from_url("rediss+cluster://u:p@h1:7000,h2:7001/").unwrap();
        assert_eq!(c.nodes(), ["rediss://u:p@h1:7000", "rediss://u:p@h2:7001"]);
    }

    #[test]
    fn errors_never_show_the_password() {
        let e = RedisConfig::from_url("redis://u:hunter2@host:notaport").unwrap_err();
        let msg = e.to_string();
        assert!(!msg.contains("hunter2"), "{msg}");
        assert!(msg.contains("u:***@host"), "{msg}");
        assert!(RedisConfig::from_url("redis+cluster://").is_err());
        assert!(RedisConfig::from_url("localhost:6379").is_err());
    }
}
