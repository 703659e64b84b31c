//! The keys denied most often lately, in bounded memory however many keys
//! there are: the Space-Saving summary of Metwally, Agrawal and El Abbadi,
//! which keeps `k` counters and, when a key it does not hold arrives with
//! every counter taken, hands it the smallest counter (counting on from
//! that count, which it records as the new key's possible overcount). Any
//! key denied more than `n / k` times out of `n` is sure to be held.
//!
//! The summary is split into stripes by the key's hash, so that threads
//! recording denials of different keys rarely wait on one lock, and a key
//! always lands in the same stripe. Each stripe keeps one table for the
//! current minute and the last few minutes' tables; [`TopKeys::rotate`],
//! called once a minute, ages them.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;

use parking_lot::Mutex;
use sluice_policy::Enforcement;

/// How many stripes the summary is split into.
const STRIPES: usize = 16;
/// Counters a stripe keeps per minute.
const PER_STRIPE: usize = 32;
/// The longest key kept, in bytes; longer ones are cut at a character
/// boundary, so that a flood of huge keys costs no more than one of short
/// ones.
pub const MAX_KEY_BYTES: usize = 256;

/// How many minutes of tables a stripe keeps, the current one included.
pub const MINUTES: usize = 5;

/// A key held in the summary, as [`TopKeys::top`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopKey {
    /// The rule or named limit that denied it.
    pub rule: String,
    /// Whether the rule enforced the denial or only reported it.
    pub enforcement: Enforcement,
    /// The key, cut to [`MAX_KEY_BYTES`].
    pub key: String,
    /// Denials counted over the minutes kept: at least the true number,
    /// and at most `overcount` more.
    pub denied: u64,
    /// How much of `denied` may belong to keys that this one took the
    /// counter of.
    pub overcount: u64,
}

#[derive(Debug)]
struct Counter {
    /// The hash of (rule, enforcement, key), which stands for them in the table.
    hash: u64,
    rule: String,
    enforcement: Enforcement,
    key: String,
    count: u64,
    overcount: u64,
}

/// One minute of one stripe: at most [`PER_STRIPE`] counters. A list
/// scanned by hash rather than a map: finding the smallest counter, which
/// every new key of a flood needs, is then a scan of one short array, and
/// the counter it takes keeps its strings' allocations.
type Table = Vec<Counter>;

#[derive(Debug, Default)]
struct Stripe {
    current: Table,
    /// Earlier minutes' tables, newest first.
    earlier: VecDeque<Table>,
}

/// A bounded summary of the most denied (rule, key) pairs over the last
/// [`MINUTES`] minutes.
///
/// ```
/// use sluice_engine::TopKeys;
/// use sluice_policy::Enforcement::Enforce;
/// let top = TopKeys::default();
/// for i in 0..1_000 {
///     top.record("per-ip", Enforce, "203.0.113.9");
///     top.record("per-ip", Enforce, &format!("client-{i}"));
/// }
/// let first = &top.top(1)[0];
/// assert_eq!((first.key.as_str(), first.rule.as_str()), ("203.0.113.9", "per-ip"));
/// assert!(first.denied >= 1_000);
/// assert!(top.len() <= TopKeys::CAPACITY);
/// ```
#[derive(Debug)]
pub struct TopKeys {
    stripes: Box<[Mutex<Stripe>]>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for TopKeys {
    fn default() -> Self {
        TopKeys {
            stripes: (0..STRIPES).map(|_| Mutex::default()).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }
}

impl TopKeys {
    /// The most counters the summary ever holds, over all minutes.
    pub const CAPACITY: usize = STRIPES * PER_STRIPE * MINUTES;

    /// Counts one denial of `key` by `rule` in `enforcement`; keys longer than
    /// [`MAX_KEY_BYTES`] are counted by their first bytes. Never waits: a
    /// denial that finds its stripe busy is left out.
    pub fn record(&self, rule: &str, enforcement: Enforcement, key: &str) {
        let key = cut(key);
        let hash = self.hasher.hash_one((rule, enforcement, key));
        // The high bits pick the stripe, and the table compares the whole
        // hash.
        let stripe = (hash >> 60) as usize % STRIPES;
        let Some(mut stripe) = self.stripes[stripe].try_lock() else {
            return;
        };
        let table = &mut stripe.current;
        if let Some(c) = table.iter_mut().find(|c| c.hash == hash) {
            c.count += 1;
            return;
        }
        if table.len() < PER_STRIPE {
            table.push(Counter {
                hash,
                rule: rule.to_owned(),
                enforcement,
                key: key.to_owned(),
                count: 1,
                overcount: 0,
            });
            return;
        }
        // Every counter is taken: the smallest one goes to this key.
        let Some(c) = table.iter_mut().min_by_key(|c| c.count) else {
            return;
        };
        c.hash = hash;
        c.rule.clear();
        c.rule.push_str(rule);
        c.enforcement = enforcement;
        c.key.clear();
        c.key.push_str(key);
        c.overcount = c.count;
        c.count += 1;
    }

    /// Starts a new minute, forgetting the oldest of the [`MINUTES`] kept.
    pub fn rotate(&self) {
        for stripe in self.stripes.iter() {
            let mut stripe = stripe.lock();
            // The oldest minute's table, emptied, is the new one.
            let mut fresh = if stripe.earlier.len() >= MINUTES - 1 {
                stripe.earlier.pop_back().unwrap_or_default()
            } else {
                Table::new()
            };
            fresh.clear();
            let done = std::mem::replace(&mut stripe.current, fresh);
            stripe.earlier.push_front(done);
        }
    }

    /// The `n` keys denied most over the minutes kept, most first.
    pub fn top(&self, n: usize) -> Vec<TopKey> {
        let mut merged: HashMap<u64, TopKey> = HashMap::new();
        for stripe in self.stripes.iter() {
            let stripe = stripe.lock();
            for table in std::iter::once(&stripe.current).chain(&stripe.earlier) {
                for c in table {
                    let e = merged.entry(c.hash).or_insert_with(|| TopKey {
                        rule: c.rule.clone(),
                        enforcement: c.enforcement,
                        key: c.key.clone(),
                        denied: 0,
                        overcount: 0,
                    });
                    e.denied += c.count;
                    e.overcount += c.overcount;
                }
            }
        }
        let mut all: Vec<TopKey> = merged.into_values().collect();
        all.sort_unstable_by(|a, b| {
            (b.denied, &a.rule, a.enforcement.as_str(), &a.key).cmp(&(
                a.denied,
                &b.rule,
                b.enforcement.as_str(),
                &b.key,
            ))
        });
        all.truncate(n);
        all
    }

    /// How many counters the summary holds now, over all minutes: never
    /// more than [`TopKeys::CAPACITY`].
    pub fn len(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| {
                let s = s.lock();
                s.current.len() + s.earlier.iter().map(Vec::len).sum::<usize>()
            })
            .sum()
    }

    /// Whether no denial has been counted in the minutes kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `key` cut to at most [`MAX_KEY_BYTES`], at a character boundary.
fn cut(key: &str) -> &str {
    if key.len() <= MAX_KEY_BYTES {
        return key;
    }
    let mut end = MAX_KEY_BYTES;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sluice_policy::Enforcement::{Enforce, Shadow};

    #[test]
    fn a_flood_of_a_million_distinct_keys_keeps_the_summary_bounded_and_the_heavy_key_on_top() {
        let top = TopKeys::default();
        for i in 0..1_000_000u32 {
            top.record("per-ip", Enforce, &format!("flood-{i}"));
            if i % 100 == 0 {
                top.record("per-ip", Enforce, "heavy");
            }
        }
        assert!(top.len() <= STRIPES * PER_STRIPE, "{}", top.len());
        let first = &top.top(1)[0];
        assert_eq!(first.key, "heavy");
        assert!(first.denied >= 10_000 && first.denied - first.overcount <= 10_000);
    }

    #[test]
    fn a_key_longer_than_the_bound_is_cut_at_a_character_boundary() {
        let top = TopKeys::default();
        let long = "é".repeat(1_000);
        top.record("r", Enforce, &long);
        let kept = &top.top(1)[0].key;
        assert!(kept.len() <= MAX_KEY_BYTES && long.starts_with(kept.as_str()));
        assert_eq!(kept.len(), MAX_KEY_BYTES);
    }

    #[test]
    fn rotation_forgets_a_key_after_the_minutes_kept() {
        let top = TopKeys::default();
        top.record("r", Enforce, "old");
        for _ in 0..MINUTES - 1 {
            top.rotate();
        }
        assert_eq!(top.top(5).len(), 1, "still within the minutes kept");
        top.rotate();
        assert!(top.is_empty());
        assert_eq!(top.len(), 0);
    }

    #[test]
    fn the_same_key_under_two_rules_or_two_modes_is_counted_apart() {
        let top = TopKeys::default();
        top.record("a", Enforce, "k");
        top.record("a", Enforce, "k");
        top.record("b", Enforce, "k");
        top.record("b", Shadow, "k");
        let got: Vec<(String, Enforcement, u64)> = top
            .top(5)
            .into_iter()
            .map(|t| (t.rule, t.enforcement, t.denied))
            .collect();
        assert_eq!(
            got,
            [
                ("a".to_owned(), Enforce, 2),
                ("b".to_owned(), Enforce, 1),
                ("b".to_owned(), Shadow, 1)
            ]
        );
    }

    proptest! {
        /// Space-Saving's guarantee, against exact counts: every key's
        /// reported count is at least its true count and at most its true
        /// count plus its overcount, and a key denied more than n/k times
        /// in its stripe is held.
        #[test]
        fn reported_counts_bound_the_true_counts(
            keys in proptest::collection::vec(0u16..5_000, 1..6_000),
        ) {
            let top = TopKeys::default();
            let mut exact: HashMap<String, u64> = HashMap::new();
            for k in &keys {
                let key = format!("k{k}");
                top.record("r", Enforce, &key);
                *exact.entry(key).or_default() += 1;
            }
            let reported = top.top(usize::MAX);
            prop_assert!(reported.len() <= STRIPES * PER_STRIPE);
            for t in &reported {
                let truth = exact[&t.key];
                prop_assert!(t.denied >= truth && t.denied - t.overcount <= truth, "{t:?} truth {truth}");
            }
            let n = keys.len() as u64;
            for (key, &count) in &exact {
                if count > n / PER_STRIPE as u64 {
                    prop_assert!(reported.iter().any(|t| &t.key == key), "{key} denied {count} of {n}");
                }
            }
        }
    }
}
