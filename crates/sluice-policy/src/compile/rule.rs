//! A rule: its limit keys, its `match`, its limit and cost, checked
//! against each other; and the tier mistake between rules.

use crate::condition::Condition;
use crate::error::{Invalid, Pos, at};
use crate::keys::LimitKey;
use crate::policy::{Policy, Rule};
use crate::schema::RawRule;

use super::algorithm::build;
use super::cost::cost;
use super::delay::delay;

pub(super) fn compile_rule(
    r: RawRule,
    policy: &Policy,
    warnings: &mut Vec<Invalid>,
) -> Result<Rule, Invalid> {
    let mut keys: Vec<LimitKey> = Vec::with_capacity(r.limit_keys.len());
    for k in &r.limit_keys {
        let key = LimitKey::parse(&k.value).map_err(|m| at(k, m))?;
        if keys.contains(&key) {
            return Err(at(
                k,
                format!("`{}` is already one of the rule's limit_keys", k.value),
            ));
        }
        if matches!(key, LimitKey::Jwt(_)) && policy.jwt.is_none() {
            return Err(at(k, needs_jwt(&k.value)));
        }
        keys.push(key);
    }
    if keys.is_empty() {
        warnings.push(at(
            &r.name,
            format!(
                "rule `{}` has no limit_keys: every request it matches shares one bucket",
                r.name.value
            ),
        ));
    }
    let mut conditions = Vec::new();
    for (k, v) in r.conditions.map(|e| e.0).unwrap_or_default() {
        let condition = Condition::parse(&k.value, v.value).map_err(|m| at(&k, m))?;
        if matches!(condition, Condition::Jwt(..)) && policy.jwt.is_none() {
            return Err(at(&k, needs_jwt(&k.value)));
        }
        conditions.push(condition);
    }
    let config = &r.algorithm_config;
    let (limit, capacity) = build(&r.name.value, r.algorithm, config, warnings)?;
    let cost = cost(&config.value)?;
    let delay = match &r.on_limit {
        Some(on_limit) => delay(&r.name, r.domain.as_ref(), on_limit, &limit, warnings)?,
        None => None,
    };
    if limit.takes_leases() {
        if let Some(d) = &r.domain {
            return Err(at(
                d,
                "a concurrency rule cannot answer Envoy: its rate limit service never says \
                 when a request ends, so every slot would stay taken until its lease expired",
            ));
        }
        let (need, field) = cost.baseline();
        if need.fract() != 0.0 {
            return Err(at(
                config,
                format!("a concurrency rule takes whole slots: its {field} {need} is not one"),
            ));
        }
    }
    // Rules never reserve, so a request is admitted only if its cost fits in
    // one shard's capacity; if even the baseline cost does not, nothing passes.
    let (need, cost_field) = cost.baseline();
    let per_shard = limit.shard_algorithm().capacity();
    if per_shard < need {
        let shards = limit.shards();
        let split = if shards > 1 {
            format!(" split over {shards} shards leaves {per_shard} per shard, which")
        } else {
            String::new()
        };
        return Err(at(
            capacity.pos,
            format!(
                "{} {}{split} is less than the rule's {cost_field} {need}: \
                 no request could ever pass",
                capacity.label,
                limit.algorithm().capacity(),
            ),
        ));
    }
    Ok(Rule {
        limit,
        keys,
        conditions,
        cost,
        enforcement: r.mode.unwrap_or_default(),
        on_store_error: r.on_store_error.unwrap_or(policy.on_store_error),
        on_missing: r.on_missing.unwrap_or_default(),
        ipv6_prefix: policy.ipv6_prefix,
        domain: match r.domain {
            Some(d) if d.value.is_empty() => return Err(at(&d, "a domain must not be empty")),
            d => d.map(|d| d.value),
        },
        group: match r.group {
            Some(g) if g.value.is_empty() => return Err(at(&g, "a group must not be empty")),
            g => g.map(|g| g.value),
        },
        penalty: None,
        delay,
    })
}

/// Warns of the usual tier mistake: a rule with a `match` followed by a
/// catch-all rule on the same keys, neither in a group. Both apply to the
/// first rule's requests, so the catch-all's smaller limit caps them too.
pub(super) fn warn_of_ungrouped_tiers(
    rules: &[Rule],
    named_at: &[Pos],
    warnings: &mut Vec<Invalid>,
) {
    let loose = |r: &Rule| r.group.is_none() && r.enforcement == crate::Enforcement::Enforce;
    for (j, catch_all) in rules.iter().enumerate() {
        if !loose(catch_all) || !catch_all.conditions.is_empty() {
            continue;
        }
        let tier = rules[..j].iter().find(|r| {
            loose(r)
                && !r.conditions.is_empty()
                && r.keys == catch_all.keys
                && r.domain == catch_all.domain
        });
        if let (Some(tier), Some(pos)) = (tier, named_at.get(j)) {
            warnings.push(at(
                *pos,
                format!(
                    "rule `{}` has no `match` and the same limit_keys as rule `{}` above, \
                     so it also limits every request that `{}` matches; if they are tiers, \
                     give both the same `group`, and only the first that matches applies",
                    catch_all.name(),
                    tier.name(),
                    tier.name()
                ),
            ));
        }
    }
}

fn needs_jwt(what: &str) -> String {
    format!(
        "`{what}` reads a verified token's claim, but the policy has no `jwt` section \
         to verify tokens with, so the rule would never apply"
    )
}
