//! Slots on concurrency limits: the leases an admitted request or call
//! holds, and [`HeldLeases`], which gives them back when the work ends.

use std::sync::Arc;

use sluice_core::{Limit, Store, StoreError};

use crate::give_back::{Giver, Taken};

/// One lease an admitted request or call took on a concurrency limit: what
/// to release when its work ends.
#[derive(Debug, Clone)]
pub struct HeldLease {
    /// The concurrency limit (a rule's, or a named one).
    pub limit: Limit,
    /// The key under that limit.
    pub key: String,
    /// The lease's id.
    pub lease: u64,
}

impl PartialEq for HeldLease {
    fn eq(&self, other: &Self) -> bool {
        self.limit.name() == other.limit.name()
            && self.key == other.key
            && self.lease == other.lease
    }
}

impl Taken for HeldLease {
    fn limit(&self) -> &Limit {
        &self.limit
    }

    async fn give_back<S: Store>(&self, store: &S) -> Result<(), StoreError> {
        store
            .release(&self.limit, &self.key, self.lease)
            .await
            .map(drop)
    }
}

/// Releases leases in the background (see [`giver`](crate::give_back::giver)):
/// a failed release is counted, and the lease then expires on its own.
pub(crate) type Releaser = Giver<HeldLease>;

/// Leases held on concurrency limits: dropping this releases them. It holds
/// a request's slots while its work goes on, whether the work finished,
/// failed, or was abandoned (a client that went away drops the request's
/// future, and this with it). The release is a store call of its own, made
/// on the Tokio runtime the drop happens on; until it lands the slots
/// still count, so a limit is never exceeded by a request that has just
/// ended.
///
/// ```
/// use std::sync::Arc;
/// use sluice_core::MemoryStore;
/// use sluice_engine::Enforcer;
/// use sluice_policy::{Policy, RequestParts};
/// let policy = Policy::from_str("rules: [{name: uploads, limit_keys: [ip:address], algorithm: concurrency, algorithm_config: {max: 1}}]", "p").unwrap();
/// let enforcer = Enforcer::new(policy, MemoryStore::new());
/// let req = RequestParts::new("POST", "/upload").with_ip([192, 0, 2, 1].into());
/// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// let mut first = rt.block_on(enforcer.enforce(&req));
/// assert!(first.allowed);
/// let slots = enforcer.hold(&mut first);
/// assert!(!rt.block_on(enforcer.enforce(&req)).allowed, "one in flight");
/// rt.block_on(async move {
///     drop(slots);
///     tokio::task::yield_now().await;
/// });
/// assert!(rt.block_on(enforcer.enforce(&req)).allowed);
/// ```
#[must_use = "the slots are released as soon as this is dropped"]
pub struct HeldLeases {
    leases: Vec<HeldLease>,
    by: Option<Releaser>,
}

impl HeldLeases {
    /// Holds nothing.
    pub fn none() -> HeldLeases {
        HeldLeases {
            leases: Vec::new(),
            by: None,
        }
    }

    /// Holds `leases`, released by `by` when dropped.
    pub(crate) fn new(leases: Vec<HeldLease>, by: &Releaser) -> HeldLeases {
        HeldLeases {
            by: (!leases.is_empty()).then(|| Arc::clone(by)),
            leases,
        }
    }

    /// The leases held.
    pub fn leases(&self) -> &[HeldLease] {
        &self.leases
    }

    /// Lets go of the leases without releasing them: they are someone
    /// else's to release now, or were never taken.
    pub(crate) fn disarm(&mut self) -> Vec<HeldLease> {
        self.by = None;
        std::mem::take(&mut self.leases)
    }
}

impl std::fmt::Debug for HeldLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldLeases")
            .field("leases", &self.leases)
            .finish()
    }
}

impl Drop for HeldLeases {
    fn drop(&mut self) {
        if let Some(by) = self.by.take()
            && !self.leases.is_empty()
        {
            by(std::mem::take(&mut self.leases));
        }
    }
}
