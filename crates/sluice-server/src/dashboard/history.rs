//! The last minutes of an enforcer's activity, a sample a second: what the
//! dashboard draws, and what `/v1/stats` returns.

use std::collections::{HashMap, VecDeque};
use std::time::SystemTime;

use sluice_engine::{Activity, RuleActivity, StoreActivity};
use sluice_policy::Enforcement;

/// How many seconds of samples are kept: five minutes.
pub(crate) const SECONDS: usize = 300;

/// What happened in one second.
#[derive(Debug)]
pub(crate) struct Second {
    /// When the second ended.
    pub(crate) at: SystemTime,
    /// Each rule's decisions in it, allowed then denied; rules that decided
    /// nothing are left out.
    pub(crate) decisions: HashMap<(String, Enforcement), (u64, u64)>,
    /// The store calls in it.
    pub(crate) store: StoreActivity,
    /// The requests held at its end (rules with `on_limit: {delay}`).
    pub(crate) held: u64,
}

/// The samples, oldest first, and the reading the next is measured from.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub(crate) seconds: VecDeque<Second>,
    /// The last reading; `None` until the first, which only sets where
    /// the samples count from.
    last: Option<Activity>,
}

impl History {
    /// Takes in a new reading made at `at`: what changed since the last
    /// one becomes the newest second, and the oldest beyond [`SECONDS`] is
    /// dropped. The first reading only sets where counting starts, since
    /// what came before it did not happen in one second.
    pub(crate) fn push(&mut self, now: Activity, at: SystemTime) {
        let Some(last) = self.last.take() else {
            self.last = Some(now);
            return;
        };
        let before: HashMap<(&str, Enforcement), (u64, u64)> = last
            .rules
            .iter()
            .map(|r| ((r.rule.as_str(), r.enforcement), (r.allowed, r.denied)))
            .collect();
        let decisions = now
            .rules
            .iter()
            .filter_map(|r| {
                let (allowed, denied) = before
                    .get(&(r.rule.as_str(), r.enforcement))
                    .copied()
                    .unwrap_or_default();
                let delta = (
                    r.allowed.saturating_sub(allowed),
                    r.denied.saturating_sub(denied),
                );
                (delta != (0, 0)).then(|| ((r.rule.clone(), r.enforcement), delta))
            })
            .collect();
        let store = now.store.since(&last.store);
        let held = now.held;
        self.last = Some(now);
        self.seconds.push_back(Second {
            at,
            decisions,
            store,
            held,
        });
        while self.seconds.len() > SECONDS {
            self.seconds.pop_front();
        }
    }

    /// Every rule's totals at the last reading, by name, then mode.
    pub(crate) fn totals(&self) -> Vec<&RuleActivity> {
        let mut totals: Vec<&RuleActivity> = self.last.iter().flat_map(|a| &a.rules).collect();
        totals.sort_by_key(|r| (r.rule.as_str(), r.enforcement.as_str()));
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn reading(allowed: u64, denied: u64) -> Activity {
        Activity {
            rules: vec![RuleActivity {
                rule: "per-ip".into(),
                enforcement: Enforcement::Enforce,
                allowed,
                denied,
            }],
            store: StoreActivity::default(),
            held: 0,
        }
    }

    #[test]
    fn each_second_holds_what_changed_since_the_one_before() {
        let mut h = History::default();
        let t = SystemTime::UNIX_EPOCH;
        // Counting starts at the first reading.
        h.push(reading(3, 0), t);
        h.push(reading(8, 1), t + Duration::from_secs(1));
        h.push(reading(8, 1), t + Duration::from_secs(2));
        h.push(reading(15, 4), t + Duration::from_secs(3));
        let per_second: Vec<Option<(u64, u64)>> = h
            .seconds
            .iter()
            .map(|s| {
                s.decisions
                    .get(&("per-ip".into(), Enforcement::Enforce))
                    .copied()
            })
            .collect();
        assert_eq!(per_second, [Some((5, 1)), None, Some((7, 3))]);
    }

    #[test]
    fn no_more_than_five_minutes_of_seconds_are_kept() {
        let mut h = History::default();
        for i in 0..SECONDS as u64 + 51 {
            h.push(
                reading(i, 0),
                SystemTime::UNIX_EPOCH + Duration::from_secs(i),
            );
        }
        assert_eq!(h.seconds.len(), SECONDS);
        let first = h.seconds[0]
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        assert_eq!(first, Duration::from_secs(51));
    }
}
