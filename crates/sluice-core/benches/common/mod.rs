//! What the keyed benchmarks share: the quota of each mode for both
//! limiters, the keys, filling the stores, and the timing loop.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::thread;
use std::time::{Duration, Instant};

use governor::clock::QuantaInstant;
use governor::{DefaultKeyedRateLimiter, NotUntil, Quota, RateLimiter};
use sluice_core::{Decision, Limit, MemoryStore, Mode, Op, StoreError, TokenBucket};

/// The quota of one benchmark mode, for both limiters.
#[derive(Clone, Copy)]
pub(crate) enum Case {
    Allowed,
    AllowedHeld,
    Denied,
}

impl Case {
    pub(crate) const ALL: [Case; 3] = [Case::Allowed, Case::AllowedHeld, Case::Denied];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Case::Allowed => "allowed",
            Case::AllowedHeld => "allowed_held",
            Case::Denied => "denied",
        }
    }

    pub(crate) fn sluice(self) -> Limit {
        let tb = match self {
            Case::Allowed => TokenBucket::new(1e9, 1e9),
            Case::AllowedHeld => TokenBucket::new(1.0, 4e9),
            Case::Denied => TokenBucket::new(1.0 / 3600.0, 1.0),
        };
        Limit::new("api", tb.unwrap())
    }

    pub(crate) fn governor(self) -> Quota {
        let nz = |n: u32| NonZeroU32::new(n).unwrap();
        match self {
            Case::Allowed => Quota::per_second(nz(1_000_000_000)).allow_burst(nz(1_000_000_000)),
            Case::AllowedHeld => Quota::per_second(nz(1)).allow_burst(nz(4_000_000_000)),
            Case::Denied => Quota::per_hour(nz(1)).allow_burst(nz(1)),
        }
    }

    /// What every timed call should decide once the warm-up pass is done.
    pub(crate) fn expect_allowed(self) -> bool {
        !matches!(self, Case::Denied)
    }
}

/// The key counts measured, with their names in benchmark ids.
pub(crate) const KEY_COUNTS: [(&str, usize); 3] =
    [("1keys", 1), ("100kkeys", 100_000), ("1Mkeys", 1_000_000)];

/// `n` distinct keys `user:{:08}` in a shuffled order (fixed seed). The
/// strings are allocated in visiting order, as a request's key would be hot
/// in cache; the table lookups behind them are random for both sides.
pub(crate) fn keys(n: usize) -> Vec<String> {
    let mut ids: Vec<usize> = (0..n).collect();
    fastrand::Rng::with_seed(0x51u64).shuffle(&mut ids);
    ids.into_iter().map(|i| format!("user:{i:08}")).collect()
}

/// Both limiters of one case, each holding every key.
pub(crate) struct Sides {
    store: MemoryStore,
    limit: Limit,
    governor: DefaultKeyedRateLimiter<String>,
}

impl Sides {
    /// Fresh limiters for `case`, with every key decided once on both
    /// sides, in an order unrelated to the visiting order (so that the keys
    /// governor clones into its map are not laid out in memory in the order
    /// the benchmark then reads them); checks that a further call decides
    /// as `case` says every timed call will.
    pub(crate) fn filled(case: Case, keys: &[String]) -> Sides {
        let sides = Sides {
            store: MemoryStore::new(),
            limit: case.sluice(),
            governor: RateLimiter::keyed(case.governor()),
        };
        let mut order: Vec<&String> = keys.iter().collect();
        fastrand::Rng::with_seed(0xF111u64).shuffle(&mut order);
        for k in order {
            assert!(
                sides.sluice(k).unwrap().allowed,
                "first call on {k} denied by sluice"
            );
            assert!(
                sides.governor(k).is_ok(),
                "first call on {k} denied by governor"
            );
        }
        let probe = &keys[0];
        assert_eq!(sides.sluice(probe).unwrap().allowed, case.expect_allowed());
        assert_eq!(sides.governor(probe).is_ok(), case.expect_allowed());
        sides
    }

    /// One keyed decision by sluice.
    #[inline]
    pub(crate) fn sluice(&self, key: &str) -> Result<Decision, StoreError> {
        self.store
            .decide_now(Op::new(&self.limit, key, 1.0), Mode::CONSUME)
    }

    /// One keyed decision by governor.
    #[inline]
    pub(crate) fn governor(&self, key: &String) -> Result<(), NotUntil<QuantaInstant>> {
        self.governor.check_key(key)
    }
}

/// Times `iters` calls of `decide`, cycling through `keys` from `cursor`
/// (which it moves on by the calls made), on `threads` threads: each makes
/// its share, the first the remainder, starting `n / threads` keys apart.
/// With several threads, the wall time from start to the last one's end.
pub(crate) fn timed<R>(
    keys: &[String],
    cursor: &mut usize,
    iters: usize,
    threads: usize,
    decide: &(impl Fn(&String) -> R + Sync),
) -> Duration {
    let n = keys.len();
    let start_at = *cursor;
    *cursor = (*cursor + iters / threads) % n;
    let run = move |from: usize, count: usize| {
        let mut i = from;
        for _ in 0..count {
            black_box(decide(black_box(&keys[i])));
            i += 1;
            if i == n {
                i = 0;
            }
        }
    };
    if threads == 1 {
        let start = Instant::now();
        run(start_at, iters);
        return start.elapsed();
    }
    let per = iters / threads;
    let start = Instant::now();
    thread::scope(|s| {
        for t in 0..threads {
            let count = if t == 0 {
                iters - per * (threads - 1)
            } else {
                per
            };
            let from = (start_at + t * (n / threads)) % n;
            s.spawn(move || run(from, count));
        }
    });
    start.elapsed()
}
