//! What a decided request holds, and giving it back: the leases of
//! concurrency limits, and the reservations of held (shaped) requests.

use quanta::Instant;
use sluice_core::{OnStoreError, Op, Settle, Store, StoreError};

use super::Enforcer;
use crate::leases::{HeldLease, HeldLeases};
use crate::meters::StoreOp;
use crate::reservation::{Reservation, Reserved};
use crate::verdict::Verdict;

impl<S: Store + 'static> Enforcer<S> {
    /// The leases `ops` would take, held until the store answers: see
    /// [`HeldLeases::disarm`].
    pub(super) fn pending<'o>(&self, ops: impl IntoIterator<Item = &'o Op<'o>>) -> HeldLeases {
        let leases = ops
            .into_iter()
            .filter(|op| op.limit.takes_leases() && op.cost > 0.0)
            .map(|op| HeldLease {
                limit: op.limit.clone(),
                key: op.key.to_owned(),
                lease: op.lease,
            })
            .collect();
        HeldLeases::new(leases, &self.releaser)
    }

    /// Takes the leases `verdict` took (see [`Verdict::leases`]) into
    /// [`HeldLeases`] that release them when dropped: hold it for as long as the
    /// request's work goes on.
    ///
    /// [`Verdict::leases`]: crate::Verdict::leases
    pub fn hold(&self, verdict: &mut Verdict) -> HeldLeases {
        HeldLeases::new(std::mem::take(&mut verdict.leases), &self.releaser)
    }

    /// Takes what `verdict` reserved for a held request (see
    /// [`Verdict::delay`]) into a [`Reservation`] that gives it back when
    /// dropped before it is kept: hold it while the request waits, and
    /// keep it when the request goes on ([`Reservation::until_due`] does
    /// both). A verdict with no delay gives [`Reservation::none`].
    pub fn reservation(&self, verdict: &mut Verdict) -> Reservation {
        match verdict.delay {
            Some(wait) if !verdict.reserved.is_empty() => Reservation::new(
                std::mem::take(&mut verdict.reserved),
                wait,
                &self.refunder,
                &self.meters.held,
            ),
            _ => Reservation::none(),
        }
    }

    /// Gives back what `parts` reserved, now, each counted under its
    /// limit's name.
    pub(super) async fn refund(&self, parts: &[Reserved], on_error: OnStoreError) {
        for part in parts {
            // A failure is counted; the tokens then stay spent.
            let _ = self
                .settle(
                    &part.limit,
                    part.limit.name(),
                    on_error,
                    &part.key,
                    Settle::Refund(part.cost),
                )
                .await;
        }
    }

    /// Releases a lease taken by [`Enforcer::acquire_named`] or by a
    /// request (see [`crate::Verdict::leases`]): its slots come back at
    /// once. Returns whether it was still held; releasing one that is
    /// unknown, expired or already released changes nothing. A failed
    /// store call is counted in `sluice_store_errors_total`, and the lease
    /// then expires on its own.
    pub async fn release(&self, held: &HeldLease) -> Result<bool, StoreError> {
        let started = Instant::now();
        let result = self.store.release(&held.limit, &held.key, held.lease).await;
        self.meters.timed(StoreOp::Release, started);
        if let Err(e) = &result {
            crate::give_back::failed(&self.meters.errors, e, held);
        }
        result
    }
}
