//! What the keyed benchmarks share: the quota of each mode for both
//! limiters, the keys, filling the stores, and the timing loop.

// Each benchmark uses its own subset.
#![allow(dead_code)]

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

/// How the keys are visited: in which order, and how far apart threads
/// start.
pub(crate) struct Walk {
    /// Indices into the keys, in the order they are visited, round and
    /// round.
    pub(crate) visits: Vec<u32>,
    /// How many visits apart threads start.
    pub(crate) gap: usize,
}

impl Walk {
    /// Every key once a lap, in the keys' order, threads an equal share of
    /// the lap apart: they meet no key at the same time.
    pub(crate) fn apart(n: usize, threads: usize) -> Walk {
        Walk {
            visits: (0..n as u32).collect(),
            gap: n / threads.max(1),
        }
    }

    /// Every key once a lap, threads `gap` keys apart: each visits a key
    /// just after the other did, so both work on the same lock stripes and
    /// cache lines.
    pub(crate) fn near(n: usize, gap: usize) -> Walk {
        Walk {
            visits: (0..n as u32).collect(),
            gap: gap.min(n.saturating_sub(1)),
        }
    }

    /// `len` visits drawn from a Zipf distribution of exponent `s` over `n`
    /// keys (fixed seed), as real traffic comes: a few keys take most
    /// calls, and a long tail is seldom seen. Threads start half the
    /// visits apart.
    pub(crate) fn zipf(n: usize, s: f64, len: usize, threads: usize) -> Walk {
        use rand::{Rng, SeedableRng};
        let zipf = rand_distr::Zipf::new(n as f64, s).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x21DF);
        Walk {
            // Ranks start at 1; the key of rank r is keys[r - 1], which
            // `keys` placed at random among the ids.
            visits: (0..len).map(|_| rng.sample(zipf) as u32 - 1).collect(),
            gap: len / threads.max(1),
        }
    }
}

impl Walk {
    /// Copies of `keys` laid out in the order this walk visits them, one
    /// per visit, and the walk over those copies: each call's key is then
    /// read from memory just after the last one's, as a key a server has
    /// just built from a request is in cache. Only the limiters' own
    /// memory is left to be visited at random. (A walk that jumps among
    /// the keys, as Zipf's does, would otherwise miss the cache on the key
    /// string itself, a cost on both sides that no server pays.)
    pub(crate) fn laid_out(&self, keys: &[String]) -> (Vec<String>, Walk) {
        let copies = self
            .visits
            .iter()
            .map(|&v| keys[v as usize].clone())
            .collect();
        let walk = Walk {
            visits: (0..self.visits.len() as u32).collect(),
            gap: self.gap,
        };
        (copies, walk)
    }
}

/// In which order the keys are first decided, which for governor is the
/// order its map's copies of the keys are laid out in memory.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// An order unrelated to the visiting order.
    Shuffled,
    /// The order they are then visited in.
    AsVisited,
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
        Sides::filled_in(case, keys, Fill::Shuffled)
    }

    /// [`Sides::filled`], deciding the keys first in the order `fill` says.
    pub(crate) fn filled_in(case: Case, keys: &[String], fill: Fill) -> Sides {
        let sides = Sides {
            store: MemoryStore::new(),
            limit: case.sluice(),
            governor: RateLimiter::keyed(case.governor()),
        };
        let mut order: Vec<&String> = keys.iter().collect();
        if fill == Fill::Shuffled {
            fastrand::Rng::with_seed(0xF111u64).shuffle(&mut order);
        }
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
    timed_walk(
        keys,
        &Walk::apart(keys.len(), threads),
        cursor,
        iters,
        threads,
        decide,
    )
}

/// [`timed`], visiting the keys as `walk` says: thread `t` starts `t *
/// walk.gap` visits after the cursor.
// Never inlined: `scripts/keyed-instructions` counts what runs inside it,
// found by its name, which an inlined copy does not have.
#[inline(never)]
pub(crate) fn timed_walk<R>(
    keys: &[String],
    walk: &Walk,
    cursor: &mut usize,
    iters: usize,
    threads: usize,
    decide: &(impl Fn(&String) -> R + Sync),
) -> Duration {
    let visits = &walk.visits;
    let n = visits.len();
    let start_at = *cursor;
    *cursor = (*cursor + iters / threads) % n;
    let run = move |from: usize, count: usize| {
        let mut i = from;
        for _ in 0..count {
            black_box(decide(black_box(&keys[visits[i] as usize])));
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
            let from = (start_at + t * walk.gap) % n;
            s.spawn(move || run(from, count));
        }
    });
    start.elapsed()
}
