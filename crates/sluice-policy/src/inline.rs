//! Limits supplied with a call rather than named in the policy file, as a
//! caller whose billing database holds each customer's quota supplies them.

use serde_json::Value;
use sluice_core::Algorithm;
use sluice_core::sliding::MAX_LOG_ENTRIES;

use crate::builder::on_store_error;
use crate::policy::{NamedLimit, Policy};

impl NamedLimit {
    /// The limit `name` configured by `algorithm` and `algorithm_config`, as
    /// a call supplies them: checked exactly as the same entry under the
    /// policy file's `limits` would be, with the same messages, and failing
    /// as `policy`'s `on_store_error` says. The error is the message alone
    /// (the entry has no file position to name).
    ///
    /// ```
    /// use serde_json::json;
    /// use sluice_policy::{NamedLimit, Policy};
    /// let policy = Policy::default();
    /// let chat = NamedLimit::inline(&policy, "chat", &json!("sliding_log"), &json!({"rate": 5, "period": "1m"}))?;
    /// assert_eq!((chat.name(), chat.limit().algorithm().name()), ("chat", "sliding_log"));
    ///
    /// let tiny = NamedLimit::inline(&policy, "chat", &json!("token_bucket"), &json!({"rps": 1, "burst": 0}));
    /// assert!(tiny.unwrap_err().contains("`burst` is 0 and there is no `max_reserved`"));
    /// # Ok::<_, String>(())
    /// ```
    pub fn inline(
        policy: &Policy,
        name: &str,
        algorithm: &Value,
        algorithm_config: &Value,
    ) -> Result<NamedLimit, String> {
        // JSON is YAML too: the entry goes through the policy file's own
        // parser and checks, on one line.
        let document = serde_json::json!({
            "on_store_error": on_store_error(policy.on_store_error()),
            "limits": {name: {"algorithm": algorithm, "algorithm_config": algorithm_config}},
        });
        let compiled = Policy::from_str(&document.to_string(), "inline").map_err(|e| e.message)?;
        let named = compiled
            .named_limit(name)
            .cloned()
            .ok_or_else(|| format!("no limit named {name:?} was made"))?;
        // What a policy file is warned of, a caller is refused: a log this
        // long costs the store time and memory on every call, and whoever
        // wrote it is not there to read a warning.
        if let Algorithm::SlidingLog(sl) = named.limit().shard_algorithm()
            && sl.rate() > MAX_LOG_ENTRIES as f64
        {
            return Err(format!(
                "a sliding_log brought with a call logs at most {MAX_LOG_ENTRIES} calls a key \
                 (a rate of {} per shard is more); use a sliding_window, or shards",
                sl.rate()
            ));
        }
        Ok(named)
    }
}
