//! What a request took and must give back when its work ends or it goes
//! away (a lease's slots, a held request's reserved tokens), given back in
//! the background by a store call each, whatever the store's type.

use std::sync::Arc;

use sluice_core::{Limit, OnStoreError, Store, StoreError};

use crate::store_errors::{StoreErrorLog, store_failed};

/// Something taken on a limit that a store call gives back.
pub(crate) trait Taken: Send + Sync + 'static {
    /// The limit it was taken on.
    fn limit(&self) -> &Limit;

    /// Gives it back on `store`.
    fn give_back<'a, S: Store>(
        &'a self,
        store: &'a S,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;
}

/// Gives what was taken back in the background.
pub(crate) type Giver<T> = Arc<dyn Fn(Vec<T>) + Send + Sync>;

/// The [`Giver`] of `store`: a task on the Tokio runtime the items are let
/// go on that gives each back in turn (on none, nothing is given back: a
/// lease expires on its own, reserved tokens stay spent). A failure is
/// counted and logged in `errors`, as a failed decision is.
pub(crate) fn giver<S: Store + 'static, T: Taken>(
    store: Arc<S>,
    errors: Arc<StoreErrorLog>,
) -> Giver<T> {
    Arc::new(move |items: Vec<T>| {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, errors) = (Arc::clone(&store), Arc::clone(&errors));
        runtime.spawn(async move {
            for item in &items {
                if let Err(e) = item.give_back(&*store).await {
                    failed(&errors, &e, item);
                }
            }
        });
    })
}

/// Counts and logs what the store could not give back: a lease's slots
/// then come back when it expires, and reserved tokens stay spent.
pub(crate) fn failed(errors: &StoreErrorLog, e: &StoreError, item: &impl Taken) {
    store_failed(errors, e, [(item.limit().name(), OnStoreError::Open)]);
}
