//! The output of `sluice replay`: one JSON line per event, told from the
//! engine's verdict or a named limit's decision.

use serde::Serialize;
use sluice_core::{CostError, Decision};
use sluice_engine::Verdict;
use sluice_policy::Policy;

/// One output line: the decision for one event.
#[derive(Debug, Serialize)]
pub(crate) struct Line<'a> {
    pub(crate) t: &'a serde_json::Number,
    pub(crate) allowed: bool,
    pub(crate) rule: Option<&'a str>,
    #[serde(serialize_with = "sluice_server::numbers::optional_number")]
    pub(crate) limit: Option<f64>,
    pub(crate) remaining: Option<u64>,
    pub(crate) retry_after: Option<f64>,
    pub(crate) reset: Option<f64>,
    /// Shadow rules that would have denied the event.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) shadow_denied: Vec<&'a str>,
    /// Why the event was refused without the store deciding: a cost that
    /// can never succeed, a missing key part, a store that failed closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// For a release: whether the lease was still held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) released: Option<bool>,
}

impl<'a> Line<'a> {
    /// No rule applied.
    fn none(t: &'a serde_json::Number) -> Line<'a> {
        Line {
            t,
            allowed: true,
            rule: None,
            limit: None,
            remaining: None,
            retry_after: None,
            reset: None,
            shadow_denied: Vec::new(),
            error: None,
            released: None,
        }
    }

    /// A release of a lease of `limit`.
    pub(crate) fn released(t: &'a serde_json::Number, limit: &'a str, released: bool) -> Line<'a> {
        Line {
            rule: Some(limit),
            released: Some(released),
            ..Line::none(t)
        }
    }

    /// A request's line: its deciding rule's numbers, or the rule that
    /// refused it and why; the transaction waits for its slowest member.
    pub(crate) fn request(t: &'a serde_json::Number, v: &'a Verdict, policy: &Policy) -> Line<'a> {
        let mut line = match (&v.refusal, v.deciding()) {
            (Some((rule, why)), _) => Line {
                allowed: false,
                rule: Some(rule),
                limit: policy
                    .rules()
                    .iter()
                    .find(|r| r.name() == rule)
                    .map(|r| r.limit().algorithm().capacity()),
                error: Some(why.to_string()),
                ..Line::none(t)
            },
            (None, Some(d)) => Line {
                retry_after: v.retry_after,
                ..Line::decided(t, &d.rule, &d.decision, v.allowed)
            },
            (None, None) => Line::none(t),
        };
        line.shadow_denied = v.shadow_denied().collect();
        line
    }

    /// A named limit's decision.
    pub(crate) fn decided(
        t: &'a serde_json::Number,
        rule: &'a str,
        d: &Decision,
        allowed: bool,
    ) -> Line<'a> {
        Line {
            allowed,
            rule: Some(rule),
            limit: Some(d.capacity),
            remaining: Some(d.remaining),
            retry_after: d.retry_after,
            reset: Some(d.reset),
            ..Line::none(t)
        }
    }

    /// A named limit's call whose cost it can never admit.
    pub(crate) fn refused(
        t: &'a serde_json::Number,
        rule: &'a str,
        capacity: f64,
        err: &CostError,
    ) -> Line<'a> {
        Line {
            allowed: false,
            rule: Some(rule),
            limit: Some(capacity),
            error: Some(err.to_string()),
            ..Line::none(t)
        }
    }
}
