//! Validation: turns the file as written into a [`Policy`], refusing anything
//! that could never work, at the position of the value responsible.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;
use std::time::Duration;

use serde_saphyr::Spanned;
use sluice_core::sliding::MAX_LOG_ENTRIES;
use sluice_core::{
    Algorithm, Calendar, CalendarUnit, Concurrency, FixedWindow, Limit, MAX_EXACT_TOKENS, Nanos,
    SlidingLog, SlidingWindow, TokenBucket,
};

use crate::condition::Condition;
use crate::error::{Invalid, Pos, at};
use crate::identity::client_ip::{ForwardingHeader, TrustedProxies};
use crate::identity::jwt::JwtVerifier;
use crate::keys::{Cost, CostSource, LimitKey};
use crate::penalty::Penalty;
use crate::policy::{NamedLimit, Policy, Rule, StoreConfig};
use crate::schema::{
    AlgorithmKind, Num, RawConfig, RawOnLimit, RawPolicy, RawRule, RawStore, RawTrustedProxies,
    StoreKind,
};
use crate::secs::Secs;

/// The most shards a limit may be split into. A shard is a key of its own
/// in the store, and a value or a reset visits every one.
pub(crate) const MAX_SHARDS: u32 = 1024;

/// The shortest period: below a millisecond no clock or network keeps time
/// well enough for the limit to mean what it says.
const MIN_PERIOD: Nanos = Nanos(Nanos::PER_SEC / 1_000);

/// Periods and window alignments are kept to whole microseconds, the
/// resolution of Redis's clock: finer, a window could not open at the same
/// instant on every store, and the Redis store refuses it.
fn whole_micros(field: &str) -> String {
    format!("`{field}` must be a whole number of microseconds")
}

/// The slowest refill: one token in ten years. Slower is almost surely a
/// slip of the exponent, and its waits no longer fit in a timestamp.
const MAX_SECS_PER_TOKEN: f64 = 10.0 * 365.0 * 24.0 * 3600.0;

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

/// What only a named limit can get wrong: callers choose its costs and may
/// reserve, so its capacity must admit a whole call, and a reservation
/// should have a bound of the operator's choosing.
fn check_named(
    name: &Spanned<String>,
    limit: &Limit,
    capacity: &CapacitySource,
    warnings: &mut Vec<Invalid>,
) -> Result<(), Invalid> {
    let alg = limit.algorithm();
    let cap = alg.capacity();
    if cap == 0.0 && alg.max_reserved().is_none() {
        return Err(at(
            capacity.pos,
            format!(
                "{} is 0 and there is no `max_reserved`: no call could pass without \
                 reserving; give `max_reserved` for a queue with no burst",
                capacity.label
            ),
        ));
    }
    if cap > 0.0 && cap < 1.0 {
        warnings.push(at(
            capacity.pos,
            format!(
                "{} {cap} is less than 1: a call that costs 1 can never pass",
                capacity.label
            ),
        ));
    }
    if alg.reserves() && alg.max_reserved().is_none() {
        let span = match alg {
            Algorithm::FixedWindow(fw) if fw.calendar().is_some() => {
                let unit = fw.calendar().map_or("window", |c| c.unit().name());
                format!("{} {unit}s of refill", fw.debt_windows())
            }
            _ => "a year of refill".to_owned(),
        };
        warnings.push(at(
            name,
            format!(
                "limit `{}` has no `max_reserved`: a caller that reserves may take up to \
                 {} tokens ({span}) ahead and hold every caller of the key back \
                 that long; set `max_reserved`, and let only trusted callers reserve",
                name.value,
                alg.reservable()
            ),
        ));
    }
    Ok(())
}

fn compile_rule(r: RawRule, policy: &Policy, warnings: &mut Vec<Invalid>) -> Result<Rule, Invalid> {
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

/// The longest a rule may hold a request: past an hour a client has long
/// given up, and each held request keeps a connection and a task.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(3600);

/// The rule's `on_limit: {delay: {max}}`, checked against its limit: only
/// a limit that takes reservations can say when a request is due.
fn delay(
    name: &Spanned<String>,
    domain: Option<&Spanned<String>>,
    on_limit: &Spanned<RawOnLimit>,
    limit: &Limit,
    warnings: &mut Vec<Invalid>,
) -> Result<Option<Duration>, Invalid> {
    let Some(delay) = &on_limit.value.delay else {
        return Ok(None);
    };
    let max = &delay.value.max;
    let name = &name.value;
    if max.value.0.0 <= 0 || max.value.0.as_secs_f64() > MAX_DELAY.as_secs_f64() {
        return Err(at(
            max,
            format!(
                "`max` is {} s; a delay must be longer than 0 and at most an hour",
                max.value.0.as_secs_f64()
            ),
        ));
    }
    let alg = limit.algorithm();
    if !alg.reserves() {
        return Err(at(
            delay,
            format!(
                "a {} cannot delay: only a token_bucket or a fixed_window takes the \
                 reservations that say when a request is due",
                alg.name()
            ),
        ));
    }
    let max_secs = max.value.0.as_secs_f64();
    let max_d = Duration::from_nanos(max.value.0.0.unsigned_abs());
    if let Some(domain) = domain {
        warnings.push(at(
            delay,
            format!(
                "rule `{name}` answers Envoy (domain `{}`), whose rate limit service cannot \
                 hold a request: it refuses beyond its limit as if it had no `delay`",
                domain.value
            ),
        ));
    }
    // The wait of the deepest reservation the limit allows, and the
    // `max_reserved` that a wait of `max` allows.
    let (deepest, fits) = match alg {
        sluice_core::Algorithm::TokenBucket(tb) => (
            alg.max_reserved().map(|m| m / tb.rate()),
            (tb.rate() * max_secs).floor(),
        ),
        sluice_core::Algorithm::FixedWindow(fw) => (
            alg.max_reserved()
                .map(|m| (m / fw.rate()).ceil() * fw.period().as_secs_f64()),
            (max_secs / fw.period().as_secs_f64()).floor() * fw.rate(),
        ),
        _ => (None, 0.0),
    };
    match deepest {
        None => warnings.push(at(
            delay,
            format!(
                "rule `{name}` delays but has no `max_reserved`: a request that would wait \
                 longer than `max` reserves and is then given back, two store calls for a \
                 refusal, and a flood reserves a year ahead in between; set `max_reserved` \
                 to {fits}, what `max` can hold"
            ),
        )),
        Some(wait) if wait > max_secs => warnings.push(at(
            max,
            format!(
                "`max` {max_secs} s is shorter than the {wait} s the rule's `max_reserved` \
                 may make a request wait: a request reserved beyond {max_secs} s is given \
                 back and refused; set `max_reserved` to {fits}, or `max` to {wait} s"
            ),
        )),
        Some(_) => {}
    }
    Ok(Some(max_d))
}

/// Warns of the usual tier mistake: a rule with a `match` followed by a
/// catch-all rule on the same keys, neither in a group. Both apply to the
/// first rule's requests, so the catch-all's smaller limit caps them too.
fn warn_of_ungrouped_tiers(rules: &[Rule], named_at: &[Pos], warnings: &mut Vec<Invalid>) {
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

fn trusted_proxies(
    t: &Spanned<RawTrustedProxies>,
    warnings: &mut Vec<Invalid>,
) -> Result<TrustedProxies, Invalid> {
    let list = &t.value.cidrs;
    let cidrs: Vec<&str> = list.iter().map(|s| s.value.as_str()).collect();
    let proxies = TrustedProxies::parse(&cidrs).map_err(|e| match list.get(e.index) {
        Some(entry) => at(entry, e.message),
        None => at(t, e.message),
    })?;
    match &t.value.header {
        Some(h) => match ForwardingHeader::parse(&h.value) {
            Some(header) => Ok(proxies.with_header(header)),
            None => Err(at(
                h,
                format!(
                    "`header` {:?} is not a forwarding header; expected `forwarded` or \
                     `x-forwarded-for`, whichever the proxies write",
                    h.value
                ),
            )),
        },
        None => {
            if !proxies.is_empty() {
                warnings.push(at(
                    t,
                    "trusted_proxies does not say which header the proxies write, so both \
                     `Forwarded` and `X-Forwarded-For` are read, and a client that adds the \
                     one its proxy passes on unchanged is keyed on the proxy's address; write \
                     `trusted_proxies: {cidrs: [...], header: x-forwarded-for}` (or `forwarded`)",
                ));
            }
            Ok(proxies)
        }
    }
}

/// The longest penalty: a year, as long as a reservation may make a caller
/// wait. Longer is almost surely a slip, and a key cannot be let off early
/// but by a reset.
const MAX_PENALTY: Nanos = sluice_core::RESERVATION_HORIZON;

/// The penalty of the rule or limit `owner`, if it sets one, claiming the
/// name of its gate's state so that no other rule or limit can share it.
fn penalty(
    names: &mut HashMap<String, (Pos, &'static str)>,
    owner: &Spanned<String>,
    raw: Option<&Spanned<Secs>>,
) -> Result<Option<Penalty>, Invalid> {
    let Some(p) = raw else {
        return Ok(None);
    };
    let d = p.value.0;
    if d < MIN_PERIOD || d > MAX_PENALTY {
        return Err(at(
            p,
            format!(
                "penalty is {} s; it must be from 1ms to a year",
                d.as_secs_f64()
            ),
        ));
    }
    if d.0 % 1_000 != 0 {
        return Err(at(p, whole_micros("penalty")));
    }
    let gate = Spanned {
        value: Penalty::gate_name(&owner.value),
        ..owner.clone()
    };
    claim(names, &gate, "penalty state")?;
    Penalty::new(&owner.value, d)
        .map(Some)
        .map_err(|e| at(p, e.to_string()))
}

/// Records `name` as taken, refusing empty and duplicate names.
fn claim(
    names: &mut HashMap<String, (Pos, &'static str)>,
    name: &Spanned<String>,
    kind: &'static str,
) -> Result<(), Invalid> {
    if name.value.is_empty() {
        return Err(at(name, format!("a {kind} name must not be empty")));
    }
    match names.entry(name.value.clone()) {
        Entry::Vacant(v) => {
            v.insert((Pos::from(name), kind));
            Ok(())
        }
        Entry::Occupied(o) => {
            let (first, first_kind) = *o.get();
            Err(at(
                name,
                if first_kind == kind {
                    format!(
                        "duplicate {kind} name `{}`; it is first used at {first}",
                        name.value
                    )
                } else {
                    format!(
                        "{kind} name `{}` is already the name of a {first_kind} at {first}; \
                         rules and limits share one namespace in the store",
                        name.value
                    )
                },
            ))
        }
    }
}

fn store(s: &Spanned<RawStore>) -> Result<StoreConfig, Invalid> {
    let r = &s.value;
    let wrong = |field: &str, kind: &str| format!("`{field}` applies to the {kind} store only");
    let timeout = || match &r.timeout_ms {
        Some(t) if t.value == 0 => Err(at(t, "`timeout_ms` must be at least 1")),
        Some(t) => Ok(Some(Duration::from_millis(t.value))),
        None => Ok(None),
    };
    if !matches!(r.kind, StoreKind::Postgres) {
        if let Some(x) = &r.schema {
            return Err(at(x, wrong("schema", "postgres")));
        }
        if let Some(x) = &r.durable {
            return Err(at(x, wrong("durable", "postgres")));
        }
    }
    match r.kind {
        StoreKind::Memory => {
            if let Some(u) = &r.url {
                return Err(at(u, wrong("url", "redis or postgres")));
            }
            if let Some(t) = &r.timeout_ms {
                return Err(at(t, wrong("timeout_ms", "redis or postgres")));
            }
            let max_keys = match &r.max_keys {
                Some(m) if m.value == 0 => return Err(at(m, "`max_keys` must be at least 1")),
                Some(m) => Some(usize::try_from(m.value).map_err(|_| at(m, "too large"))?),
                None => None,
            };
            Ok(StoreConfig::Memory { max_keys })
        }
        StoreKind::Redis => {
            if let Some(m) = &r.max_keys {
                return Err(at(m, wrong("max_keys", "memory")));
            }
            let Some(url) = &r.url else {
                return Err(at(
                    s,
                    "a redis store needs a `url`, such as redis://127.0.0.1:6379/0",
                ));
            };
            if !(url.value.starts_with("redis://") || url.value.starts_with("rediss://")) {
                return Err(at(
                    url,
                    "the redis `url` must start with redis:// or rediss://",
                ));
            }
            Ok(StoreConfig::Redis {
                url: url.value.clone(),
                timeout: timeout()?,
            })
        }
        StoreKind::Postgres => {
            if let Some(m) = &r.max_keys {
                return Err(at(m, wrong("max_keys", "memory")));
            }
            let Some(url) = &r.url else {
                return Err(at(
                    s,
                    "a postgres store needs a `url`, such as postgres://app@127.0.0.1:5432/app",
                ));
            };
            if !(url.value.starts_with("postgres://") || url.value.starts_with("postgresql://")) {
                return Err(at(
                    url,
                    "the postgres `url` must start with postgres:// or postgresql://",
                ));
            }
            if let Some(x) = &r.schema {
                let plain = x.value.len() <= 63
                    && x.value
                        .starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                    && x.value
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if !plain {
                    return Err(at(
                        x,
                        "`schema` must be 1 to 63 lowercase ASCII letters, digits and `_`, \
                         starting with a letter or `_`",
                    ));
                }
            }
            Ok(StoreConfig::Postgres {
                url: url.value.clone(),
                timeout: timeout()?,
                schema: r.schema.as_ref().map(|x| x.value.clone()),
                durable: r.durable.as_ref().is_none_or(|d| d.value),
            })
        }
    }
}

/// Where a limit's capacity was set, for errors about it.
struct CapacitySource {
    pos: Pos,
    label: String,
}

impl CapacitySource {
    fn given(field: &str, v: &Spanned<Num>) -> Self {
        CapacitySource {
            pos: Pos::from(v),
            label: format!("`{field}`"),
        }
    }

    fn defaulted(name: &str, rate: &Rate) -> Self {
        CapacitySource {
            pos: rate.pos,
            label: format!("the {name} (by default the `{}`)", rate.field),
        }
    }
}

/// Builds the limit named `name`, shards applied.
fn build(
    name: &str,
    kind: AlgorithmKind,
    config: &Spanned<RawConfig>,
    warnings: &mut Vec<Invalid>,
) -> Result<(Limit, CapacitySource), Invalid> {
    let c = &config.value;
    if kind != AlgorithmKind::FixedWindow
        && let Some(pos) = c
            .calendar
            .as_ref()
            .map(Pos::from)
            .or(c.timezone.as_ref().map(Pos::from))
    {
        return Err(at(
            pos,
            "only a fixed_window opens on the calendar (`calendar`, `timezone`)",
        ));
    }
    let (algorithm, capacity) = match kind {
        AlgorithmKind::TokenBucket => token_bucket(c, &rated(config, warnings)?)?,
        AlgorithmKind::FixedWindow if c.calendar.is_some() || c.timezone.is_some() => {
            let (rate, calendar) = on_calendar(config)?;
            fixed_window(c, &rate, Some(calendar))?
        }
        AlgorithmKind::FixedWindow => fixed_window(c, &rated(config, warnings)?, None)?,
        AlgorithmKind::SlidingWindow => sliding_window(c, &rated(config, warnings)?)?,
        AlgorithmKind::SlidingLog => sliding_log(c, &rated(config, warnings)?)?,
        AlgorithmKind::Concurrency => concurrency(config)?,
    };
    let mut limit = Limit::new(name, algorithm);
    if let (Some(s), Algorithm::Concurrency(_)) = (&c.shards, &algorithm) {
        return Err(at(
            s,
            "a concurrency limit has no `shards`: its `max` slots are whole, and one key's \
             calls in flight are few enough for one",
        ));
    }
    if let Some(s) = &c.shards {
        if s.value > MAX_SHARDS {
            return Err(at(
                s,
                format!("`shards` must be at most {MAX_SHARDS}, got {}", s.value),
            ));
        }
        limit = limit.with_shards(s.value).map_err(|e| at(s, e))?;
    }
    if let Algorithm::SlidingLog(per_shard) = limit.shard_algorithm()
        && per_shard.rate() > MAX_LOG_ENTRIES as f64
    {
        // A sliding log's capacity is its rate, given where this points.
        warnings.push(at(
            capacity.pos,
            format!(
                "a key of this sliding_log may log {} calls of cost 1 per period; past \
                 {MAX_LOG_ENTRIES} a key merges its newest entries, which can deny a little \
                 early; a sliding_window counts in constant memory",
                per_shard.rate()
            ),
        ));
    }
    Ok((limit, capacity))
}

/// The rate of an algorithm that has one: every one but concurrency, whose
/// `max` and `lease` it refuses.
fn rated(config: &Spanned<RawConfig>, warnings: &mut Vec<Invalid>) -> Result<Rate, Invalid> {
    let c = &config.value;
    let misplaced = [
        ("max", c.max.as_ref().map(Pos::from)),
        ("lease", c.lease.as_ref().map(Pos::from)),
    ]
    .into_iter()
    .find_map(|(f, pos)| Some((f, pos?)));
    if let Some((field, pos)) = misplaced {
        return Err(at(
            pos,
            format!("`{field}` belongs to a concurrency limit (`algorithm: concurrency`)"),
        ));
    }
    rate(config, warnings)
}

/// Tokens per period, from whichever of `rps`, `tokens_per_second`, `rate` is given.
struct Rate {
    tokens: f64,
    period: Nanos,
    pos: Pos,
    field: &'static str,
}

fn rate(config: &Spanned<RawConfig>, warnings: &mut Vec<Invalid>) -> Result<Rate, Invalid> {
    let c = &config.value;
    let given = one_of(
        [
            ("rps", &c.rps),
            ("tokens_per_second", &c.tokens_per_second),
            ("rate", &c.rate),
        ],
        "the rate",
    )?;
    let Some((field, value)) = given else {
        return Err(at(
            config,
            "algorithm_config needs a rate: `rps`, `tokens_per_second`, \
             or `rate` with an optional `period`",
        ));
    };
    let tokens = positive(field, value)?;
    let period = match &c.period {
        None => {
            if field == "rate" {
                warnings.push(at(
                    value,
                    "`rate` without `period` counts per second; write `rps` to say so, \
                     or give the `period` it was meant for",
                ));
            }
            Nanos(Nanos::PER_SEC)
        }
        Some(p) if field != "rate" => {
            return Err(at(
                p,
                format!(
                    "`period` cannot be combined with `{field}`, which is per second; \
                     use `rate` with `period` instead"
                ),
            ));
        }
        Some(p) if p.value.0.0 <= 0 => return Err(at(p, "`period` must be positive")),
        Some(p) if p.value.0 < MIN_PERIOD => {
            return Err(at(p, "`period` must be at least 1ms"));
        }
        Some(p) if p.value.0.0 % 1_000 != 0 => return Err(at(p, whole_micros("period"))),
        Some(p) => p.value.0,
    };
    let secs_per_token = period.as_secs_f64() / tokens;
    if secs_per_token > MAX_SECS_PER_TOKEN {
        return Err(at(
            value,
            format!(
                "`{field}` {tokens} refills one token every {secs_per_token:e} s; \
                 the slowest allowed is one token in ten years"
            ),
        ));
    }
    Ok(Rate {
        tokens,
        period,
        pos: Pos::from(value),
        field,
    })
}

fn token_bucket(c: &RawConfig, rate: &Rate) -> Result<(Algorithm, CapacitySource), Invalid> {
    if let Some(s) = &c.start {
        return Err(at(
            s,
            "`start` aligns fixed windows; a token_bucket has no windows",
        ));
    }
    // `capacity` is accepted as another name for the burst, as some people write it.
    let burst = one_of(
        [("burst", &c.burst), ("capacity", &c.capacity)],
        "the burst",
    )?;
    let per_sec = rate.tokens / rate.period.as_secs_f64();
    let mut tb = TokenBucket::new(per_sec, rate.tokens).map_err(|e| at(rate.pos, e))?;
    let capacity = match burst {
        Some((field, v)) => {
            tb = tb
                .with_capacity(non_negative(field, v)?)
                .map_err(|e| at(v, e))?;
            CapacitySource::given(field, v)
        }
        None => CapacitySource::defaulted("burst", rate),
    };
    if let Some(m) = &c.max_reserved {
        tb = tb
            .with_max_reserved(non_negative("max_reserved", m)?)
            .map_err(|e| at(m, e))?;
    }
    Ok((tb.into(), capacity))
}

/// A calendar window's `rate` per unit and its [`Calendar`]: `calendar:
/// month` with `timezone: Europe/Berlin` (UTC when absent). `period` and
/// `start` are the calendar's to say, and a rate per second has no unit.
fn on_calendar(config: &Spanned<RawConfig>) -> Result<(Rate, Calendar), Invalid> {
    let c = &config.value;
    let Some(unit_field) = &c.calendar else {
        let tz = c.timezone.as_ref().map_or(Pos::from(config), Pos::from);
        return Err(at(
            tz,
            "`timezone` says where calendar windows open: give `calendar` (day, week, month              or year) too",
        ));
    };
    let clashing = [
        ("period", c.period.as_ref().map(Pos::from)),
        ("start", c.start.as_ref().map(Pos::from)),
        ("rps", c.rps.as_ref().map(Pos::from)),
        (
            "tokens_per_second",
            c.tokens_per_second.as_ref().map(Pos::from),
        ),
    ];
    if let Some((field, pos)) = clashing.into_iter().find_map(|(f, pos)| Some((f, pos?))) {
        return Err(at(
            pos,
            format!(
                "`{field}` cannot be combined with `calendar`: a calendar window admits `rate`                  tokens in each {}, which opens at local midnight",
                unit_field.value
            ),
        ));
    }
    let unit: CalendarUnit = unit_field.value.parse().map_err(|e| at(unit_field, e))?;
    let calendar = match &c.timezone {
        Some(tz) => Calendar::new(unit, &tz.value).map_err(|e| at(tz, e))?,
        None => Calendar::utc(unit),
    };
    let Some(value) = &c.rate else {
        return Err(at(
            config,
            format!("a calendar window needs `rate`: the tokens in each {unit}"),
        ));
    };
    let rate = Rate {
        tokens: positive("rate", value)?,
        period: unit.nominal(),
        pos: Pos::from(value),
        field: "rate",
    };
    Ok((rate, calendar))
}

fn fixed_window(
    c: &RawConfig,
    rate: &Rate,
    calendar: Option<Calendar>,
) -> Result<(Algorithm, CapacitySource), Invalid> {
    if let Some(b) = &c.burst {
        return Err(at(
            b,
            "a fixed_window has no `burst`; use `capacity` to let unused tokens roll over",
        ));
    }
    let mut fw = match calendar {
        Some(cal) => FixedWindow::on_calendar(rate.tokens, cal),
        None => FixedWindow::new(rate.tokens, rate.period),
    }
    .map_err(|e| at(rate.pos, e))?;
    let mut capacity = CapacitySource::defaulted("capacity", rate);
    if let Some(v) = &c.capacity {
        fw = fw
            .with_capacity(non_negative("capacity", v)?)
            .map_err(|e| at(v, e))?;
        capacity = CapacitySource::given("capacity", v);
    }
    if let Some(s) = &c.start {
        if s.value.0.0 < 0 {
            return Err(at(s, "`start` must not be negative"));
        }
        if s.value.0.0 % 1_000 != 0 {
            return Err(at(s, whole_micros("start")));
        }
        fw = fw.with_start(s.value.0);
    }
    if let Some(m) = &c.max_reserved {
        fw = fw
            .with_max_reserved(non_negative("max_reserved", m)?)
            .map_err(|e| at(m, e))?;
    }
    Ok((fw.into(), capacity))
}

/// Refuses what a sliding algorithm has no use for: it admits at most its
/// `rate` per `period`, with no burst above it and no reservations.
fn refuse_for_sliding(c: &RawConfig, name: &str) -> Result<(), Invalid> {
    let burst = [("burst", &c.burst), ("capacity", &c.capacity)]
        .into_iter()
        .find_map(|(f, v)| Some((f, v.as_ref()?)));
    if let Some((field, v)) = burst {
        return Err(at(
            v,
            format!(
                "a {name} has no `{field}`: it admits at most `rate` per `period`; \
                 use a token_bucket for bursts above the rate"
            ),
        ));
    }
    if let Some(m) = &c.max_reserved {
        return Err(at(
            m,
            format!("a {name} takes no reservations, so it has no `max_reserved`"),
        ));
    }
    Ok(())
}

/// Where a sliding algorithm's capacity comes from: its rate.
fn rate_as_capacity(rate: &Rate) -> CapacitySource {
    CapacitySource {
        pos: rate.pos,
        label: format!("`{}`", rate.field),
    }
}

fn sliding_window(c: &RawConfig, rate: &Rate) -> Result<(Algorithm, CapacitySource), Invalid> {
    refuse_for_sliding(c, "sliding_window")?;
    let mut sw =
        SlidingWindow::per_period(rate.tokens, rate.period).map_err(|e| at(rate.pos, e))?;
    if let Some(s) = &c.start {
        if s.value.0.0 < 0 {
            return Err(at(s, "`start` must not be negative"));
        }
        if s.value.0.0 % 1_000 != 0 {
            return Err(at(s, whole_micros("start")));
        }
        sw = sw.with_start(s.value.0);
    }
    Ok((sw.into(), rate_as_capacity(rate)))
}

fn sliding_log(c: &RawConfig, rate: &Rate) -> Result<(Algorithm, CapacitySource), Invalid> {
    refuse_for_sliding(c, "sliding_log")?;
    if let Some(s) = &c.start {
        return Err(at(
            s,
            "`start` aligns windows; a sliding_log has none: its window ends at every call",
        ));
    }
    let sl = SlidingLog::per_period(rate.tokens, rate.period).map_err(|e| at(rate.pos, e))?;
    Ok((sl.into(), rate_as_capacity(rate)))
}

/// How long a concurrency limit's lease lasts when `lease` is not given.
const DEFAULT_LEASE: Nanos = Nanos(60 * Nanos::PER_SEC);

fn concurrency(config: &Spanned<RawConfig>) -> Result<(Algorithm, CapacitySource), Invalid> {
    let c = &config.value;
    let rate_fields = [
        ("rps", c.rps.as_ref().map(Pos::from)),
        (
            "tokens_per_second",
            c.tokens_per_second.as_ref().map(Pos::from),
        ),
        ("rate", c.rate.as_ref().map(Pos::from)),
        ("period", c.period.as_ref().map(Pos::from)),
        ("burst", c.burst.as_ref().map(Pos::from)),
        ("capacity", c.capacity.as_ref().map(Pos::from)),
        ("start", c.start.as_ref().map(Pos::from)),
        ("max_reserved", c.max_reserved.as_ref().map(Pos::from)),
    ];
    if let Some((field, pos)) = rate_fields.into_iter().find_map(|(f, pos)| Some((f, pos?))) {
        return Err(at(
            pos,
            format!(
                "a concurrency limit counts calls in flight, not calls over time: it has \
                 no `{field}`; give `max` (and `lease`)"
            ),
        ));
    }
    let Some(max) = &c.max else {
        return Err(at(
            config,
            "a concurrency limit needs `max`: how many calls of a key may be in flight at once",
        ));
    };
    let lease = match &c.lease {
        None => DEFAULT_LEASE,
        Some(l) if l.value.0 < MIN_PERIOD => return Err(at(l, "`lease` must be at least 1ms")),
        Some(l) if l.value.0 > sluice_core::RESERVATION_HORIZON => {
            return Err(at(l, "`lease` must be at most a year"));
        }
        Some(l) if l.value.0.0 % 1_000 != 0 => return Err(at(l, whole_micros("lease"))),
        Some(l) => l.value.0,
    };
    let limit = Concurrency::new(max.value.0, lease).map_err(|e| at(max, e))?;
    Ok((limit.into(), CapacitySource::given("max", max)))
}

fn cost(c: &RawConfig) -> Result<Cost, Invalid> {
    let source = match &c.cost_source {
        Some(s) => CostSource::parse(&s.value).map_err(|m| at(s, m))?,
        None => CostSource::Fixed,
    };
    let amount = |field, v: &Option<Spanned<Num>>| match v {
        Some(v) => positive(field, v),
        None => Ok(1.0),
    };
    Ok(Cost::new(
        source,
        amount("fixed_cost", &c.fixed_cost)?,
        amount("default_cost", &c.default_cost)?,
    ))
}

fn forbid_cost(c: &RawConfig) -> Result<(), Invalid> {
    let fields = [
        ("cost_source", c.cost_source.as_ref().map(Pos::from)),
        ("fixed_cost", c.fixed_cost.as_ref().map(Pos::from)),
        ("default_cost", c.default_cost.as_ref().map(Pos::from)),
    ];
    match fields.into_iter().find_map(|(f, pos)| Some((f, pos?))) {
        Some((field, pos)) => Err(at(
            pos,
            format!("`{field}` applies to rules; a named limit is charged what each call asks"),
        )),
        None => Ok(()),
    }
}

/// The one field of `fields` that is set, refusing two that set the same thing.
fn one_of<'a, const N: usize>(
    fields: [(&'static str, &'a Option<Spanned<Num>>); N],
    what: &str,
) -> Result<Option<(&'static str, &'a Spanned<Num>)>, Invalid> {
    let mut given: Vec<_> = fields
        .into_iter()
        .filter_map(|(f, v)| Some((f, v.as_ref()?)))
        .collect();
    // Blame whichever of the two comes later in the file.
    given.sort_by_key(|(_, v)| Pos::from(*v));
    match given.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(*one)),
        [(first, _), (second, v), ..] => Err(at(
            *v,
            format!("`{second}` and `{first}` both set {what}; give only one of them"),
        )),
    }
}

fn positive(field: &str, v: &Spanned<Num>) -> Result<f64, Invalid> {
    let x = v.value.0;
    if x > MAX_EXACT_TOKENS {
        Err(too_many(field, v))
    } else if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(at(
            v,
            format!("`{field}` must be a positive number, got {x}"),
        ))
    }
}

fn non_negative(field: &str, v: &Spanned<Num>) -> Result<f64, Invalid> {
    let x = v.value.0;
    if x > MAX_EXACT_TOKENS {
        Err(too_many(field, v))
    } else if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(at(v, format!("`{field}` must be a number >= 0, got {x}")))
    }
}

fn too_many(field: &str, v: &Spanned<Num>) -> Invalid {
    at(
        v,
        format!(
            "`{field}` {} is more than {MAX_EXACT_TOKENS}, the most tokens that can be \
             counted exactly",
            v.value.0
        ),
    )
}
