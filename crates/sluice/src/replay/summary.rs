//! Per-rule totals of a replay: how often each rule applied, allowed and
//! denied, and which keys it denied most.

use std::collections::HashMap;
use std::io::Write;

use serde::Serialize;
use sluice_core::Decision;
use sluice_engine::{Refusal, Verdict};
use sluice_policy::{Enforcement, Policy, readable_key};

const TOP_KEYS: usize = 5;

#[derive(Debug, Default, Serialize)]
struct RuleTotals {
    name: String,
    mode: &'static str,
    /// Events the rule applied to.
    hits: u64,
    /// Events it allowed (for enforce rules, as part of an allowed transaction).
    allowed: u64,
    /// Events it denied (shadow rules: would have denied).
    denied: u64,
    /// Events it allowed but another rule of the same transaction denied.
    rolled_back: u64,
    /// Events whose cost it could never admit.
    refused: u64,
    /// Cost admitted.
    admitted_cost: f64,
    #[serde(skip)]
    denied_keys: HashMap<String, u64>,
    /// The keys denied most often, most first.
    top_denied_keys: Vec<(String, u64)>,
}

impl RuleTotals {
    fn new(name: &str, enforcement: Enforcement) -> Self {
        RuleTotals {
            name: name.to_owned(),
            mode: enforcement.as_str(),
            ..RuleTotals::default()
        }
    }

    fn record(&mut self, key: &str, allowed: bool, denied: bool, cost: f64) {
        self.hits += 1;
        if allowed {
            self.allowed += 1;
            self.admitted_cost += cost;
        } else if denied {
            self.denied += 1;
            *self.denied_keys.entry(key.to_owned()).or_default() += 1;
        } else {
            self.rolled_back += 1;
        }
    }
}

/// Totals for every rule and named limit of a policy.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Summary {
    events: u64,
    allowed: u64,
    denied: u64,
    unmatched: u64,
    rules: Vec<RuleTotals>,
    limits: Vec<RuleTotals>,
    #[serde(skip)]
    rule_index: HashMap<String, usize>,
    #[serde(skip)]
    limit_index: HashMap<String, usize>,
    /// The top denied keys have been picked (and the counts let go).
    #[serde(skip)]
    finished: bool,
}

impl Summary {
    pub(crate) fn new(policy: &Policy) -> Summary {
        let rules: Vec<_> = policy
            .rules()
            .iter()
            .map(|r| RuleTotals::new(r.name(), r.enforcement()))
            .collect();
        let limits: Vec<_> = policy
            .named_limits()
            .iter()
            .map(|l| RuleTotals::new(l.name(), l.enforcement()))
            .collect();
        Summary {
            rule_index: rules
                .iter()
                .enumerate()
                .map(|(i, r)| (r.name.clone(), i))
                .collect(),
            limit_index: limits
                .iter()
                .enumerate()
                .map(|(i, r)| (r.name.clone(), i))
                .collect(),
            rules,
            limits,
            ..Summary::default()
        }
    }

    /// Counts an event's overall result.
    pub(crate) fn event(&mut self, allowed: bool, matched: bool) {
        self.events += 1;
        match (matched, allowed) {
            (false, _) => self.unmatched += 1,
            (true, true) => self.allowed += 1,
            (true, false) => self.denied += 1,
        }
    }

    fn rule(&mut self, name: &str) -> Option<&mut RuleTotals> {
        let i = *self.rule_index.get(name)?;
        self.rules.get_mut(i)
    }

    /// Counts a request's verdict: each shadow rule's result, each enforced
    /// rule's part in it, and the request itself.
    pub(crate) fn verdict(&mut self, v: &Verdict) {
        for s in &v.shadow {
            if let Some(r) = self.rule(&s.rule) {
                r.record(&s.key, s.allowed, !s.allowed, s.cost);
            }
        }
        if let Some((rule, Refusal::Cost(_))) = &v.refusal
            && let Some(r) = self.rule(rule)
        {
            r.hits += 1;
            r.refused += 1;
        }
        for d in &v.rules {
            if let Some(r) = self.rule(&d.rule) {
                r.record(&d.key, v.allowed, !d.decision.allowed, d.cost);
            }
        }
        self.event(v.allowed, v.matched());
    }

    pub(crate) fn call(&mut self, name: &str, key: &str, cost: f64, d: &Decision) {
        let Some(&i) = self.limit_index.get(name) else {
            return;
        };
        if let Some(r) = self.limits.get_mut(i) {
            r.record(key, d.allowed, !d.allowed, cost);
        }
    }

    fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        for r in self.rules.iter_mut().chain(self.limits.iter_mut()) {
            let mut keys: Vec<_> = r
                .denied_keys
                .drain()
                .map(|(k, n)| (readable_key(&k), n))
                .collect();
            keys.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            keys.truncate(TOP_KEYS);
            r.top_denied_keys = keys;
        }
    }

    /// The totals as JSON, as `{"summary": ...}` holds them.
    pub(crate) fn finished_json(&mut self) -> serde_json::Value {
        self.finish();
        serde_json::to_value(&*self).unwrap_or(serde_json::Value::Null)
    }

    /// Writes `{"summary": ...}` as one JSON line, and a table for people.
    pub(crate) fn write(
        &mut self,
        json: &mut impl Write,
        table: &mut impl Write,
    ) -> anyhow::Result<()> {
        self.finish();
        #[derive(Serialize)]
        struct Line<'a> {
            summary: &'a Summary,
        }
        serde_json::to_writer(&mut *json, &Line { summary: self })?;
        writeln!(json)?;
        writeln!(
            table,
            "{} events: {} allowed, {} denied, {} matched no rule",
            self.events, self.allowed, self.denied, self.unmatched
        )?;
        writeln!(
            table,
            "{:<28} {:<8} {:>10} {:>10} {:>10} {:>11}  top denied keys",
            "rule", "mode", "hits", "allowed", "denied", "rolled back"
        )?;
        for r in self.rules.iter().chain(&self.limits) {
            let top: Vec<String> = r
                .top_denied_keys
                .iter()
                .map(|(k, n)| format!("{k} ({n})"))
                .collect();
            writeln!(
                table,
                "{:<28} {:<8} {:>10} {:>10} {:>10} {:>11}  {}",
                r.name,
                r.mode,
                r.hits,
                r.allowed,
                r.denied,
                r.rolled_back,
                top.join(", ")
            )?;
        }
        Ok(())
    }
}
