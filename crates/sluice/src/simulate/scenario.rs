//! What a simulation sends: the built-in scenarios, or one read from a
//! file, as waves of calls from clients, and whether denied clients retry.

use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;
use sluice_policy::Policy;

/// The built-in scenarios, by name, with what each shows.
pub(crate) const BUILT_IN: [(&str, &str); 5] = [
    (
        "double-window",
        "One client sends a limit's worth of calls in the last second before a window boundary, \
         and as many again in the first second after it.",
    ),
    (
        "burst-then-steady",
        "A burst of three times the limit at once, then a steady half of the rate for three \
         periods.",
    ),
    (
        "many-clients",
        "Ten clients, each with a key of its own, calling steadily at a quarter to two and a half \
         times the rate.",
    ),
    (
        "thundering-herd",
        "Two hundred clients, each with a key of its own, all spend their limit and one call \
         more at once; each denied call retries after the Retry-After it was given, with \
         Sluice's per-key jitter and without it.",
    ),
    (
        "shaped-vs-refused",
        "One client, under a token bucket of ten calls a second with a burst of five: six calls \
         a second for ten seconds, then bursts of thirty in half a second every three seconds, then a \
         flood of sixty a second for two seconds. Once the rule holds a call over the limit until the bucket \
         has room for it, for up to two seconds (on_limit: delay, max_reserved 20), and once \
         it refuses it.",
    ),
];

/// A wave of calls: `count` calls of `key`, evenly spread over `over`
/// seconds from `at`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Wave {
    pub(crate) at: f64,
    pub(crate) count: u32,
    #[serde(default)]
    pub(crate) over: f64,
    #[serde(default = "default_key")]
    pub(crate) key: String,
}

fn default_key() -> String {
    "client".to_owned()
}

/// A token bucket that holds calls over its limit rather than refusing
/// them, as a rule with `on_limit: {delay: {max}}` does: a scenario with
/// one is run through that bucket twice, delaying and refusing, instead of
/// through every algorithm.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Shaping {
    /// The bucket's burst (its capacity); its rate is the scenario's.
    pub(crate) burst: f64,
    /// How far below zero a reservation may take the bucket: how many
    /// calls are held at once, at most.
    pub(crate) max_reserved: f64,
    /// The longest a call is held, in seconds (the `max` of `delay`).
    pub(crate) max: f64,
}

impl Shaping {
    /// Refuses what the policy would, and retries, which a shaped
    /// scenario does not model: a held call is not told to come back.
    fn check(&self, s: &Scenario) -> anyhow::Result<()> {
        if !(self.burst.is_finite() && self.burst >= 1.0) {
            bail!("`shaping.burst` must be a number ≥ 1");
        }
        if !(self.max_reserved.is_finite() && self.max_reserved >= 0.0) {
            bail!("`shaping.max_reserved` must be a finite number ≥ 0");
        }
        if !(self.max.is_finite() && self.max > 0.0 && self.max <= 3600.0) {
            bail!("`shaping.max` must be more than 0 seconds and at most an hour");
        }
        if s.retries > 0 {
            bail!("a scenario with `shaping` does not retry: leave out `retries`");
        }
        Ok(())
    }

    /// The policy of a shaped scenario: one rule, `sim`, a token bucket
    /// at the scenario's rate keyed by the header `x-client`, which delays
    /// as `on_limit: {delay: {max}}` says where the caller can hold a
    /// request, and refuses where it cannot.
    pub(crate) fn policy(&self, s: &Scenario) -> anyhow::Result<Policy> {
        let text = format!(
            "rules:\n  - name: sim\n    limit_keys: [\"header:{KEY_HEADER}\"]\n    \
             algorithm: token_bucket\n    algorithm_config: {{rate: {}, period: {}, \
             burst: {}, max_reserved: {}}}\n    on_limit: {{delay: {{max: {}}}}}\n",
            s.rate, s.period, self.burst, self.max_reserved, self.max
        );
        Ok(Policy::from_str(&text, "simulation")?)
    }
}

/// The header that carries a shaped scenario's key.
pub(crate) const KEY_HEADER: &str = "x-client";

/// A simulation: the limit every algorithm is given (`rate` per `period`
/// seconds), the calls, and whether a denied call is tried again.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Scenario {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) description: String,
    pub(crate) rate: f64,
    pub(crate) period: f64,
    pub(crate) waves: Vec<Wave>,
    /// Denied calls are tried again after their Retry-After, up to this
    /// many times each (0: never).
    #[serde(default)]
    pub(crate) retries: u32,
    /// Delay against refuse, on one token bucket, instead of comparing
    /// the algorithms.
    #[serde(default)]
    pub(crate) shaping: Option<Shaping>,
}

/// The most calls a scenario may send, so that a file cannot ask for more
/// time or memory than a report is worth.
pub(crate) const MAX_CALLS: u64 = 2_000_000;

impl Scenario {
    /// The built-in scenario `name`.
    pub(crate) fn built_in(name: &str) -> anyhow::Result<Scenario> {
        let described = |n: &str| {
            BUILT_IN
                .iter()
                .find(|(b, _)| *b == n)
                .map_or(String::new(), |(_, d)| (*d).to_owned())
        };
        let wave = |at: f64, count: u32, over: f64, key: &str| Wave {
            at,
            count,
            over,
            key: key.to_owned(),
        };
        let built = |rate: f64, period: f64, waves: Vec<Wave>, retries: u32| Scenario {
            name: name.to_owned(),
            description: described(name),
            rate,
            period,
            waves,
            retries,
            shaping: None,
        };
        let scenario = match name {
            "double-window" => built(
                1000.0,
                60.0,
                vec![
                    wave(59.0, 1000, 1.0, "client"),
                    wave(60.0, 1000, 1.0, "client"),
                ],
                0,
            ),
            "burst-then-steady" => built(
                100.0,
                10.0,
                vec![
                    wave(0.0, 300, 1.0, "client"),
                    wave(1.0, 150, 30.0, "client"),
                ],
                0,
            ),
            // Client i calls (i + 1) / 4 times the rate for a minute.
            "many-clients" => built(
                20.0,
                10.0,
                (0..10u32)
                    .map(|i| wave(0.0, 2 * 60 * (i + 1) / 4, 60.0, &format!("client-{i}")))
                    .collect(),
                0,
            ),
            "thundering-herd" => built(
                5.0,
                60.0,
                (0..200u32)
                    .map(|i| wave(0.0, 6, 0.05, &format!("client-{i}")))
                    .collect(),
                20,
            ),
            "shaped-vs-refused" => {
                let mut waves = vec![wave(0.0, 60, 10.0, "client")];
                waves.extend((0..5).map(|i| wave(10.0 + 3.0 * f64::from(i), 30, 0.5, "client")));
                waves.push(wave(25.0, 120, 2.0, "client"));
                Scenario {
                    shaping: Some(Shaping {
                        burst: 5.0,
                        max_reserved: 20.0,
                        max: 2.0,
                    }),
                    ..built(10.0, 1.0, waves, 0)
                }
            }
            other => bail!(
                "no built-in scenario {other:?}; there are {}, or give --file",
                BUILT_IN.map(|(n, _)| n).join(", ")
            ),
        };
        Ok(scenario)
    }

    /// A scenario read from a JSON file.
    pub(crate) fn from_file(path: &Path) -> anyhow::Result<Scenario> {
        let text = sluice_policy::read_capped(path, sluice_policy::MAX_POLICY_BYTES)
            .with_context(|| format!("{}: cannot read the scenario", path.display()))?;
        let s: Scenario = serde_json::from_slice(&text)
            .with_context(|| format!("{}: not a scenario", path.display()))?;
        s.check().with_context(|| path.display().to_string())?;
        Ok(s)
    }

    /// Refuses what cannot be simulated in bounded time and memory.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if !(self.rate.is_finite() && self.rate > 0.0) {
            bail!("`rate` must be a positive number");
        }
        if !(self.period.is_finite() && self.period >= 0.001 && self.period <= 86_400.0 * 366.0) {
            bail!("`period` must be from 0.001 to a year of seconds");
        }
        let mut calls: u64 = 0;
        for w in &self.waves {
            if !(w.at.is_finite() && w.at >= 0.0 && w.over.is_finite() && w.over >= 0.0) {
                bail!("a wave's `at` and `over` must be finite numbers of seconds ≥ 0");
            }
            if w.at + w.over > 86_400.0 * 366.0 {
                bail!("a wave must end within a year");
            }
            calls += u64::from(w.count);
        }
        if let Some(shaping) = &self.shaping {
            shaping.check(self)?;
        }
        let most = calls.saturating_mul(u64::from(self.retries) + 1);
        if most > MAX_CALLS {
            bail!("the scenario could send {most} calls; at most {MAX_CALLS} are simulated");
        }
        Ok(())
    }

    /// The policy of the limit `sim`: `algorithm` at the scenario's rate,
    /// its windows, if it has any, opening at 0.
    pub(crate) fn policy(&self, algorithm: &str) -> anyhow::Result<Policy> {
        let (rate, period) = (self.rate, self.period);
        let start = if matches!(algorithm, "fixed_window" | "sliding_window") {
            ", start: 0"
        } else {
            ""
        };
        let text = format!(
            "limits:\n  sim:\n    algorithm: {algorithm}\n    \
             algorithm_config: {{rate: {rate}, period: {period}{start}}}\n"
        );
        Ok(Policy::from_str(&text, "simulation")?)
    }

    /// Every first call, as (time, key), in time order.
    pub(crate) fn arrivals(&self) -> Vec<(f64, &str)> {
        let mut calls: Vec<(f64, &str)> = self
            .waves
            .iter()
            .flat_map(|w| {
                let step = if w.count > 1 {
                    w.over / f64::from(w.count)
                } else {
                    0.0
                };
                (0..w.count).map(move |i| (w.at + step * f64::from(i), w.key.as_str()))
            })
            .collect();
        calls.sort_by(|a, b| a.0.total_cmp(&b.0));
        calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_scenario_is_within_bounds() {
        for (name, description) in BUILT_IN {
            let s = Scenario::built_in(name).unwrap();
            assert_eq!(s.description, description);
            s.check().unwrap();
            assert!(!s.arrivals().is_empty());
        }
        assert!(Scenario::built_in("nope").is_err());
    }

    #[test]
    fn a_scenario_that_would_send_too_much_is_refused() {
        let mut s = Scenario::built_in("thundering-herd").unwrap();
        s.waves[0].count = u32::MAX;
        assert!(s.check().unwrap_err().to_string().contains("at most"));
        let mut s = Scenario::built_in("double-window").unwrap();
        s.period = f64::NAN;
        assert!(s.check().is_err());
    }

    #[test]
    fn waves_spread_their_calls_evenly() {
        let s = Scenario::built_in("double-window").unwrap();
        let a = s.arrivals();
        assert_eq!(a.len(), 2000);
        assert_eq!(a[0], (59.0, "client"));
        assert!((a[999].0 - 59.999).abs() < 1e-9);
        assert_eq!(a[1000].0, 60.0);
    }
}
