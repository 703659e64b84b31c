//! Validation: turns the file as written into a [`Policy`], refusing anything
//! that could never work, at the position of the value responsible.
//!
//! A module a part of the file: the `store` and `trusted_proxies` sections,
//! a limit's `algorithm` (and its `rate` and number `fields`), a `rule` and
//! its `cost` and `delay`, a `named` limit, a `penalty`, and the `names`
//! that rules, limits and penalties share; [`compile`] puts them together.

mod algorithm;
mod cost;
mod delay;
mod fields;
mod named;
mod names;
mod penalty;
mod rate;
mod rule;
mod store;
mod trusted_proxies;

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Invalid, Pos, at};
use crate::identity::jwt::JwtVerifier;
use crate::policy::{NamedLimit, Policy};
use crate::schema::RawPolicy;

use algorithm::build;
use cost::forbid_cost;
use named::check_named;
use names::claim;
use penalty::penalty;
use rule::{compile_rule, warn_of_ungrouped_tiers};
use store::store;
use trusted_proxies::trusted_proxies;

/// Compiles a policy read from `file` (key files are found relative to it),
/// with the warnings about what it holds that is legal but looks wrong.
pub(crate) fn compile(raw: RawPolicy, file: &Path) -> Result<(Policy, Vec<Invalid>), Invalid> {
    let mut warnings = Vec::new();
    let mut policy = Policy {
        on_store_error: raw.on_store_error.unwrap_or_default(),
        empty_on_purpose: raw.rules.as_ref().is_some_and(Vec::is_empty)
            || raw.limits.as_ref().is_some_and(|l| l.0.is_empty()),
        ..Policy::default()
    };
    if let Some(t) = &raw.trusted_proxies {
        policy.trusted_proxies = trusted_proxies(t, &mut warnings)?;
    }
    if let Some(p) = &raw.ipv6_prefix {
        policy.ipv6_prefix = match u8::try_from(p.value) {
            Ok(bits @ 1..=128) => bits,
            _ => {
                return Err(at(
                    p,
                    format!(
                        "ipv6_prefix is {}; it must be a prefix length from 1 to 128 \
                         (64 groups each client's /64, 128 keys every address alone)",
                        p.value
                    ),
                ));
            }
        };
    }
    if let Some(jwt) = &raw.jwt {
        let base = file.parent().unwrap_or(Path::new(""));
        let verifier = JwtVerifier::build(&jwt.value, base).map_err(|e| e.into_invalid(jwt))?;
        policy.jwt = Some(verifier);
    }
    if let Some(s) = &raw.store {
        policy.store = store(s)?;
    }
    // Rules and named limits share one namespace: the store keys state by
    // limit name, so a rule and a limit with the same name would share buckets.
    let mut names = HashMap::new();
    for (name, limit) in raw.limits.map(|e| e.0).unwrap_or_default() {
        claim(&mut names, &name, "limit")?;
        let penalty = penalty(&mut names, &name, limit.value.penalty.as_ref())?;
        let config = &limit.value.algorithm_config;
        let (built, capacity) = build(&name.value, limit.value.algorithm, config, &mut warnings)?;
        forbid_cost(&config.value)?;
        check_named(&name, &built, &capacity, &mut warnings)?;
        policy.limit_index.insert(name.value, policy.limits.len());
        policy.limits.push(NamedLimit {
            limit: built,
            enforcement: limit.value.mode.unwrap_or_default(),
            on_store_error: limit.value.on_store_error.unwrap_or(policy.on_store_error),
            penalty,
        });
    }
    let mut named_at = Vec::new();
    for rule in raw.rules.unwrap_or_default() {
        claim(&mut names, &rule.value.name, "rule")?;
        named_at.push(Pos::from(&rule.value.name));
        let penalty = penalty(&mut names, &rule.value.name, rule.value.penalty.as_ref())?;
        let mut compiled = compile_rule(rule.value, &policy, &mut warnings)?;
        compiled.penalty = penalty;
        policy.rules.push(compiled);
    }
    policy.delays = policy.rules.iter().any(|r| r.delay().is_some());
    warn_of_ungrouped_tiers(&policy.rules, &named_at, &mut warnings);
    warnings.sort_by_key(|w| w.pos);
    Ok((policy, warnings))
}
