//! The limits that calls supply with themselves (`algorithm` and
//! `algorithm_config` beside the limit's name), kept by name so that each
//! configuration is checked once, and bounded so that a client cannot
//! exhaust memory by inventing names: every name is a table in the memory
//! store and a label in the metrics.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use sluice_core::OnStoreError;
use sluice_policy::{NamedLimit, Policy};

/// How many inline limit names an enforcer keeps unless told otherwise.
pub const DEFAULT_MAX_INLINE_LIMITS: usize = 256;

/// The longest name an inline limit may have.
pub const MAX_INLINE_NAME: usize = 128;

/// Why an inline limit was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InlineError {
    /// The configuration is not one the policy file would accept; the
    /// message is the policy file's own.
    Invalid(String),
    /// The name is a limit or a rule of the policy: an inline limit of the
    /// same name would share and reconfigure its state.
    NamedInPolicy(String),
    /// The name is empty, too long, or has a character other than ASCII
    /// letters, digits, `_`, `.` and `-`. Others could spell another
    /// limit's state: a store writes a sharded limit's keys as
    /// `<name>:<shard>`, and an Envoy override's as `<rule>@<count>/<unit>`.
    BadName(String),
    /// As many names as the enforcer keeps are taken, and this is a new one.
    Full(usize),
}

impl fmt::Display for InlineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InlineError::Invalid(why) => f.write_str(why),
            InlineError::BadName(name) => write!(
                f,
                "an inline limit's name is 1 to {MAX_INLINE_NAME} ASCII letters, digits, \
                 `_`, `.` or `-`, not {name:?}"
            ),
            InlineError::NamedInPolicy(name) => write!(
                f,
                "{name:?} is a limit or rule of the policy; call it without `algorithm` \
                 and `algorithm_config`, or give the inline limit another name"
            ),
            InlineError::Full(max) => write!(
                f,
                "this server already keeps {max} inline limit names, the most it keeps; \
                 reuse one of them"
            ),
        }
    }
}

impl std::error::Error for InlineError {}

/// One name's configuration as last given, and the limit made of it.
struct Inline {
    /// The policy's `on_store_error` is part of what is made, and a reload
    /// may change it.
    on_store_error: OnStoreError,
    algorithm: Value,
    algorithm_config: Value,
    limit: Arc<NamedLimit>,
}

impl Inline {
    fn is(
        &self,
        on_store_error: OnStoreError,
        algorithm: &Value,
        algorithm_config: &Value,
    ) -> bool {
        self.on_store_error == on_store_error
            && self.algorithm == *algorithm
            && self.algorithm_config == *algorithm_config
    }
}

/// The inline limits seen so far, by name.
pub(crate) struct InlineLimits {
    max: usize,
    by_name: Mutex<HashMap<String, Inline>>,
}

impl InlineLimits {
    pub(crate) fn new(max: usize) -> InlineLimits {
        InlineLimits {
            max,
            by_name: Mutex::new(HashMap::new()),
        }
    }

    /// The limit `name` configured as given, checked the first time this
    /// configuration is given for this name. A name given again with
    /// another configuration takes it: its keys' state carries over (see
    /// `docs/semantics.md`).
    pub(crate) fn get(
        &self,
        policy: &Policy,
        name: &str,
        algorithm: &Value,
        algorithm_config: &Value,
    ) -> Result<Arc<NamedLimit>, InlineError> {
        if policy.named_limit(name).is_some() || policy.rules().iter().any(|r| r.name() == name) {
            return Err(InlineError::NamedInPolicy(name.to_owned()));
        }
        let on_store_error = policy.on_store_error();
        {
            let by_name = self.by_name.lock();
            match by_name.get(name) {
                Some(known) if known.is(on_store_error, algorithm, algorithm_config) => {
                    return Ok(Arc::clone(&known.limit));
                }
                None if by_name.len() >= self.max => return Err(InlineError::Full(self.max)),
                _ => {}
            }
        }
        // Checked without the lock, which other calls are waiting on.
        let limit = Arc::new(
            NamedLimit::inline(policy, name, algorithm, algorithm_config)
                .map_err(InlineError::Invalid)?,
        );
        let mut by_name = self.by_name.lock();
        if !by_name.contains_key(name) && by_name.len() >= self.max {
            return Err(InlineError::Full(self.max));
        }
        by_name.insert(
            name.to_owned(),
            Inline {
                on_store_error,
                algorithm: algorithm.clone(),
                algorithm_config: algorithm_config.clone(),
                limit: Arc::clone(&limit),
            },
        );
        Ok(limit)
    }

    /// The limit `name` as last given, if it was.
    pub(crate) fn named(&self, name: &str) -> Option<Arc<NamedLimit>> {
        self.by_name
            .lock()
            .get(name)
            .map(|known| Arc::clone(&known.limit))
    }
}

/// Whether `name` may name an inline limit (see [`InlineError::BadName`]).
pub(crate) fn check_name(name: &str) -> Result<(), InlineError> {
    let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if name.is_empty() || name.len() > MAX_INLINE_NAME || !name.chars().all(fine) {
        return Err(InlineError::BadName(name.to_owned()));
    }
    Ok(())
}
