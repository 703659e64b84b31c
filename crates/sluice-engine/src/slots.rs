//! Slots on concurrency limits: the leases an admitted request or call
//! holds, and [`Slots`], which gives them back when the work ends.

use std::sync::Arc;

use sluice_core::{Limit, Store};

use crate::enforcer::Enforcer;

/// One lease an admitted request or call took on a concurrency limit: what
/// to release when its work ends.
#[derive(Debug, Clone)]
pub struct Held {
    /// The concurrency limit (a rule's, or a named one).
    pub limit: Limit,
    /// The key under that limit.
    pub key: String,
    /// The lease's id.
    pub lease: u64,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.limit.name() == other.limit.name()
            && self.key == other.key
            && self.lease == other.lease
    }
}

/// Gives leases back without knowing the store's type, so that [`Slots`]
/// is one type whatever the enforcer's store.
trait Release: Send + Sync {
    fn release_all(self: Arc<Self>, leases: Vec<Held>);
}

impl<S: Store + 'static> Release for Enforcer<S> {
    fn release_all(self: Arc<Self>, leases: Vec<Held>) {
        // Dropped on a Tokio runtime, as every front end's requests are; on
        // none, the leases expire on their own.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for held in &leases {
                    // A failure is counted and logged by `release`; the
                    // lease then expires on its own.
                    let _ = self.release(held).await;
                }
            });
        }
    }
}

/// The slots a request holds on concurrency limits while its work goes on:
/// dropping this releases them, whether the work finished, failed, or was
/// abandoned (a client that went away drops the request's future, and
/// this with it). The release is a store call of its own, made on the Tokio
/// runtime the drop happens on; until it lands the slots still count, so a
/// limit is never exceeded by a request that has just ended.
///
/// ```
/// use std::sync::Arc;
/// use sluice_core::MemoryStore;
/// use sluice_engine::Enforcer;
/// use sluice_policy::{Policy, RequestParts};
/// let policy = Policy::from_str("rules: [{name: uploads, limit_keys: [ip:address], algorithm: concurrency, algorithm_config: {max: 1}}]", "p").unwrap();
/// let enforcer = Arc::new(Enforcer::new(policy, MemoryStore::new()));
/// let req = RequestParts::new("POST", "/upload").with_ip([192, 0, 2, 1].into());
/// let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// let policy = enforcer.policy();
/// let mut first = rt.block_on(enforcer.enforce(&policy, &req));
/// assert!(first.allowed);
/// let slots = enforcer.hold(&mut first);
/// assert!(!rt.block_on(enforcer.enforce(&policy, &req)).allowed, "one in flight");
/// rt.block_on(async move {
///     drop(slots);
///     tokio::task::yield_now().await;
/// });
/// assert!(rt.block_on(enforcer.enforce(&policy, &req)).allowed);
/// ```
#[must_use = "the slots are released as soon as this is dropped"]
pub struct Slots {
    leases: Vec<Held>,
    by: Option<Arc<dyn Release>>,
}

impl Slots {
    /// Holds nothing.
    pub fn none() -> Slots {
        Slots {
            leases: Vec::new(),
            by: None,
        }
    }

    /// The leases held.
    pub fn leases(&self) -> &[Held] {
        &self.leases
    }
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("leases", &self.leases)
            .finish()
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        if let Some(by) = self.by.take() {
            by.release_all(std::mem::take(&mut self.leases));
        }
    }
}

impl<S: Store + 'static> Enforcer<S> {
    /// Takes the leases `verdict` took (see [`Verdict::leases`]) into
    /// [`Slots`] that release them when dropped: hold it for as long as the
    /// request's work goes on.
    ///
    /// [`Verdict::leases`]: crate::Verdict::leases
    pub fn hold(self: &Arc<Self>, verdict: &mut crate::Verdict) -> Slots {
        let leases = std::mem::take(&mut verdict.leases);
        if leases.is_empty() {
            return Slots::none();
        }
        let by: Arc<dyn Release> = Arc::clone(self) as Arc<dyn Release>;
        Slots {
            leases,
            by: Some(by),
        }
    }
}
