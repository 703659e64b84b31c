//! What an enforcer has decided and how its store has answered, as running
//! totals: [`Enforcer::activity`](crate::Enforcer::activity) reads them, and
//! the difference of two readings is what happened in between. A
//! dashboard takes one a second.

use sluice_policy::Enforcement;

/// Store call durations are counted in buckets of a quarter of an octave
/// (each bucket's bounds about 19% apart), from 1 ns to about 2^64 ns.
pub const LATENCY_BUCKETS: usize = 256;

/// The bucket that a call of `nanos` is counted in.
pub(crate) fn latency_bucket(nanos: u64) -> usize {
    if nanos < 4 {
        return nanos as usize;
    }
    let octave = 63 - nanos.leading_zeros() as usize;
    // The two bits below the leading one split the octave in four.
    let quarter = ((nanos >> (octave - 2)) & 3) as usize;
    (octave * 4 + quarter).min(LATENCY_BUCKETS - 1)
}

/// The largest duration, in nanoseconds, that bucket `i` counts. Buckets 4
/// to 7 count nothing ([`latency_bucket`] puts 4 ns in bucket 8); read as
/// 3 ns, they keep the ceilings in order.
fn bucket_ceiling(i: usize) -> u64 {
    if i < 8 {
        return i.min(3) as u64;
    }
    let (octave, quarter) = (i / 4, (i % 4) as u128);
    // In u128: the top bucket's bound is 2^64.
    let ceiling = ((5 + quarter) << (octave - 2)) - 1;
    u64::try_from(ceiling).unwrap_or(u64::MAX)
}

/// Running totals of one enforcer, since it was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    /// Each rule's or named limit's decisions, per mode it has decided in.
    pub rules: Vec<RuleActivity>,
    /// The store calls.
    pub store: StoreActivity,
    /// Requests held now until their reservations are due (rules with
    /// `on_limit: {delay}`, and [`until_ready_named`] calls): not a total
    /// but the number at the reading.
    ///
    /// [`until_ready_named`]: crate::Enforcer::until_ready_named
    pub held: u64,
}

/// One rule's decisions in one mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleActivity {
    /// The rule's or named limit's name.
    pub rule: String,
    /// Enforced or shadow: a reload can move a rule between them.
    pub enforcement: Enforcement,
    /// Requests or calls it admitted (or would have, in shadow mode).
    pub allowed: u64,
    /// Requests or calls it denied (or would have).
    pub denied: u64,
}

/// Store calls: how long they took, and how many failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreActivity {
    /// Calls by duration, in [`LATENCY_BUCKETS`] buckets.
    pub latency: [u64; LATENCY_BUCKETS],
    /// Calls that failed: timed out, or the store could not be reached.
    pub errors: u64,
}

impl Default for StoreActivity {
    fn default() -> Self {
        StoreActivity {
            latency: [0; LATENCY_BUCKETS],
            errors: 0,
        }
    }
}

impl StoreActivity {
    /// Store calls made.
    pub fn calls(&self) -> u64 {
        self.latency.iter().sum()
    }

    /// The calls made since `earlier`, a reading of the same enforcer.
    #[must_use]
    pub fn since(&self, earlier: &StoreActivity) -> StoreActivity {
        let mut latency = [0; LATENCY_BUCKETS];
        for (i, n) in latency.iter_mut().enumerate() {
            *n = self.latency[i].saturating_sub(earlier.latency[i]);
        }
        StoreActivity {
            latency,
            errors: self.errors.saturating_sub(earlier.errors),
        }
    }

    /// The duration, in seconds, that a share `q` (0 to 1) of the calls
    /// took at most, rounded up to its bucket's bound (at most 19% over);
    /// `None` when no call was made.
    ///
    /// ```
    /// use sluice_engine::StoreActivity;
    /// let mut s = StoreActivity::default();
    /// assert_eq!(s.quantile(0.5), None);
    /// s.latency[40] = 99; // 1,024 to 1,279 ns
    /// s.latency[60] = 1; // 32,768 to 40,959 ns
    /// assert_eq!(s.quantile(0.5), Some(1.279e-6));
    /// assert_eq!(s.quantile(0.99), Some(1.279e-6));
    /// assert_eq!(s.quantile(1.0), Some(40.959e-6));
    /// ```
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let calls = self.calls();
        if calls == 0 {
            return None;
        }
        // The rank of the call sought, from 1.
        let rank = ((q.clamp(0.0, 1.0) * calls as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.latency.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(bucket_ceiling(i) as f64 / 1e9);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_duration_falls_in_a_bucket_whose_ceiling_is_within_a_fifth_above_it(nanos in 0u64..u64::MAX / 2) {
            let i = latency_bucket(nanos);
            prop_assert!(bucket_ceiling(i) >= nanos);
            prop_assert!(i == 0 || bucket_ceiling(i - 1) < nanos);
            prop_assert!(bucket_ceiling(i) as f64 <= nanos as f64 * 1.25 + 1.0);
        }
    }

    #[test]
    fn the_smallest_and_largest_durations_have_buckets_with_ceilings_in_order() {
        for nanos in (0..=64).chain([u64::MAX / 2, u64::MAX - 1, u64::MAX]) {
            let i = latency_bucket(nanos);
            assert!(bucket_ceiling(i) >= nanos, "{nanos} in {i}");
            assert!(i == 0 || bucket_ceiling(i - 1) < nanos, "{nanos} in {i}");
        }
        let ceilings: Vec<u64> = (0..LATENCY_BUCKETS).map(bucket_ceiling).collect();
        assert!(ceilings.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(ceilings[LATENCY_BUCKETS - 1], u64::MAX);
    }

    #[test]
    fn the_difference_of_two_readings_is_what_happened_in_between() {
        let mut before = StoreActivity::default();
        before.latency[40] = 3;
        before.errors = 1;
        let mut after = before.clone();
        after.latency[40] = 5;
        after.latency[44] = 1;
        after.errors = 4;
        let between = after.since(&before);
        assert_eq!((between.calls(), between.errors), (3, 3));
    }
}
