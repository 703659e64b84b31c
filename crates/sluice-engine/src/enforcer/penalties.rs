//! Penalties: a key that went over a limit with a `penalty` is denied
//! outright until the penalty is served, by a gate decided in the same
//! transaction as the limit.

use std::pin::Pin;

use sluice_core::{Decision, Mode, OnStoreError, Op, Outcome, Settle, Store, StoreError};
use sluice_policy::{NamedLimit, Penalty, Rule};
use smallvec::SmallVec;

use super::Enforcer;

impl<S: Store + 'static> Enforcer<S> {
    /// Decides `ops` (the `i`th for `owners[i]`) in `mode` together with the
    /// gates of their owners' penalties (see [`Penalty`]), in one
    /// transaction: a key serving a penalty is denied outright until it
    /// ends, with the rest of it as `retry_after`; a key that an owner with
    /// a penalty denies by its own limit starts serving one (a check starts
    /// none), counted in `sluice_penalties_total`.
    ///
    /// The penalty starts with a second store call, made only on such a
    /// denial, that closes the gate from the time the store makes it. A
    /// call that the same key makes in between is decided by the limit
    /// alone, which has just denied it: it is all but sure to be denied
    /// too, and is never admitted beyond the limit.
    ///
    /// Boxed: a rule with a penalty is the rare one, and what the gate holds
    /// across its two store calls would otherwise make every decision's
    /// future that much larger, to be moved into a box with each request.
    pub(super) fn gated<'a>(
        &'a self,
        ops: &'a [Op<'a>],
        owners: &'a [Owner<'a>],
        mode: Mode,
    ) -> Pin<Box<impl Future<Output = Result<Outcome, StoreError>> + 'a>> {
        Box::pin(self.gated_calls(ops, owners, mode))
    }

    /// [`Enforcer::gated`], unboxed.
    async fn gated_calls(
        &self,
        ops: &[Op<'_>],
        owners: &[Owner<'_>],
        mode: Mode,
    ) -> Result<Outcome, StoreError> {
        let mut all: Vec<Op<'_>> = ops.to_vec();
        let gates: SmallVec<[Option<(usize, &Penalty)>; 2]> = ops
            .iter()
            .zip(owners)
            .map(|(op, owner)| {
                owner.penalty.map(|p| {
                    all.push(Op::new(p.gate(), op.key, 0.0));
                    (all.len() - 1, p)
                })
            })
            .collect();
        let out = if mode.reserve {
            // A closed gate is a debt that a reservation would wait out,
            // admitting the call once the penalty ends, its tokens taken
            // meanwhile. So the gates are checked on their own first, and a
            // call that one of them shuts reserves nothing.
            let shut = self.store.transact(&all[ops.len()..], Mode::CHECK).await?;
            let mode = if shut.allowed { mode } else { Mode::CHECK };
            let mut out = self.store.transact(ops, mode).await?;
            out.decisions.extend(shut.decisions);
            out
        } else {
            self.store.transact(&all, mode).await?
        };
        let mut decisions: SmallVec<[Decision; 2]> =
            out.decisions.iter().take(ops.len()).copied().collect();
        for (i, gate) in gates.iter().enumerate() {
            let Some((g, penalty)) = *gate else { continue };
            let (d, shut) = (decisions[i], out.decisions[g]);
            if !shut.allowed {
                decisions[i] = penalized(d, shut.retry_after.unwrap_or(0.0));
            } else if !d.allowed && mode.consume {
                // Charged once however many denials land together, so that
                // the penalty runs from the first.
                match self
                    .store
                    .settle(penalty.gate(), ops[i].key, Settle::ChargeOnce(1.0))
                    .await
                {
                    Ok(closed) => {
                        decisions[i] = penalized(d, closed.reset);
                        metrics::counter!("sluice_penalties_total", "rule" => owners[i].name.to_owned())
                            .increment(1);
                    }
                    // The call is denied all the same; only its penalty
                    // could not be recorded.
                    Err(e) => self.store_failed(&e, [(owners[i].name, owners[i].on_error)]),
                }
            }
        }
        Ok(Outcome::from_decisions(decisions))
    }
}

/// Whose operation one is: a rule's or a named limit's, with what decides
/// for it beside its limit.
#[derive(Clone, Copy)]
pub(super) struct Owner<'p> {
    name: &'p str,
    on_error: OnStoreError,
    penalty: Option<&'p Penalty>,
}

impl<'p> Owner<'p> {
    pub(super) fn of_rule(rule: &'p Rule) -> Owner<'p> {
        Owner {
            name: rule.name(),
            on_error: rule.on_store_error(),
            penalty: rule.penalty(),
        }
    }

    pub(super) fn of_limit(named: &'p NamedLimit) -> Owner<'p> {
        Owner {
            name: named.name(),
            on_error: named.on_store_error(),
            penalty: named.penalty(),
        }
    }
}

/// `d` for a key serving a penalty that has `wait` seconds left: denied
/// outright, with nothing to spend, until then (or until `d`'s own wait, if
/// that is longer).
fn penalized(d: Decision, wait: f64) -> Decision {
    Decision {
        allowed: false,
        remaining: 0,
        retry_after: Some(d.retry_after.map_or(wait, |r| r.max(wait))),
        ..d
    }
}
