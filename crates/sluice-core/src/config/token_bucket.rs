//! The token bucket's configuration.

use super::{LimitError, check_admits, finite_nonneg};
use crate::time::Nanos;

/// A continuous token bucket: `rate` tokens per second up to its capacity
/// (a policy file's `burst`).
///
/// ```
/// use sluice_core::TokenBucket;
/// let tb = TokenBucket::new(10.0, 20.0).unwrap().with_max_reserved(5.0).unwrap();
/// assert_eq!((tb.rate(), tb.capacity(), tb.max_reserved()), (10.0, 20.0, Some(5.0)));
/// assert!(TokenBucket::new(-1.0, 20.0).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    // The rate is kept as the exact pair the user gave (tokens per period)
    // so that "10 per 60 s" refills 1 token in exactly 6 s, not 6.000000000000001.
    pub(super) tokens: f64,
    pub(super) period: Nanos,
    // Seconds per token, computed once as period / tokens so that "10 per
    // 60 s" waits exactly 6 s per token, and the hot path multiplies.
    pub(super) secs_per_token: f64,
    pub(super) capacity: f64,
    pub(super) max_reserved: Option<f64>,
}

impl TokenBucket {
    /// A bucket refilling at `rate` tokens per second, holding at most
    /// `capacity` (a policy file's `burst`).
    pub fn new(rate: f64, capacity: f64) -> Result<Self, LimitError> {
        Self::per_period(rate, Nanos(Nanos::PER_SEC))?.with_capacity(capacity)
    }

    /// `tokens` per `period`, with the capacity defaulting to `tokens`.
    ///
    /// ```
    /// use sluice_core::{Nanos, TokenBucket};
    /// let tb = TokenBucket::per_period(10.0, Nanos(60 * Nanos::PER_SEC)).unwrap();
    /// assert_eq!(tb.capacity(), 10.0);
    /// assert!((tb.rate() - 10.0 / 60.0).abs() < 1e-15);
    /// ```
    pub fn per_period(tokens: f64, period: Nanos) -> Result<Self, LimitError> {
        if period.0 <= 0 {
            return Err(LimitError::Period(period.as_secs_f64()));
        }
        if !(tokens.is_finite() && tokens > 0.0) {
            return Err(LimitError::Rate(tokens));
        }
        Ok(TokenBucket {
            tokens,
            period,
            secs_per_token: period.as_secs_f64() / tokens,
            capacity: tokens,
            max_reserved: None,
        })
    }

    /// Replaces the capacity.
    pub fn with_capacity(self, capacity: f64) -> Result<Self, LimitError> {
        let capacity = finite_nonneg(capacity, LimitError::Capacity)?;
        check_admits(capacity, self.max_reserved)?;
        Ok(TokenBucket { capacity, ..self })
    }

    /// Allows reservations to take the bucket down to `-max_reserved`.
    pub fn with_max_reserved(self, max_reserved: f64) -> Result<Self, LimitError> {
        let m = finite_nonneg(max_reserved, LimitError::MaxReserved)?;
        check_admits(self.capacity, Some(m))?;
        Ok(TokenBucket {
            max_reserved: Some(m),
            ..self
        })
    }

    /// Tokens added per second.
    #[inline]
    pub fn rate(&self) -> f64 {
        self.tokens / self.period.as_secs_f64()
    }

    /// Tokens added per [`TokenBucket::period`]: the rate as configured.
    #[inline]
    pub fn tokens_per_period(&self) -> f64 {
        self.tokens
    }

    /// The period the rate is expressed over (one second unless given).
    #[inline]
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// Tokens added over `ns` nanoseconds.
    #[inline]
    pub(crate) fn refill(&self, ns: i64) -> f64 {
        // One multiplication and one division keep whole results exact.
        ns as f64 * self.tokens / self.period.0 as f64
    }

    /// Seconds needed to add `tokens` tokens.
    #[inline]
    pub(crate) fn secs_for(&self, tokens: f64) -> f64 {
        tokens * self.secs_per_token
    }

    /// The most tokens the bucket holds (a policy file's `burst`).
    #[inline]
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// How far below zero a reservation may take the bucket; `None` is unlimited.
    #[inline]
    pub fn max_reserved(&self) -> Option<f64> {
        self.max_reserved
    }
}
