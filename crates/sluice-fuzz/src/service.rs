//! What the API and RLS targets serve from: one policy, parsed once, and for
//! every input a fresh in-memory store on a stopped clock, so that an input
//! always meets the same state and a crash reproduces.

use std::sync::{Arc, OnceLock};

use sluice_core::{FakeClock, MemoryStore, Nanos};
use sluice_http::Enforcer;
use sluice_policy::Policy;
use sluice_server::serve::{AnyStore, ServerState};

/// The token `/v1/reset` asks for.
pub(crate) const ADMIN_TOKEN: &str = "fuzz-admin-token";

/// The token the privileged parts of a call ask for.
pub(crate) const API_TOKEN: &str = "fuzz-api-token";

const POLICY: &str = include_str!("policy.yaml");

/// 2023-11-14, so that fixed windows have a realistic alignment.
const START: Nanos = Nanos(1_700_000_000_000_000_000);

/// A server state over the fuzzing policy and an empty store.
pub(crate) fn state() -> Arc<ServerState<FakeClock>> {
    state_with(Some(API_TOKEN))
}

/// [`state`] with `api_token` as the API token, or none.
pub(crate) fn state_with(api_token: Option<&str>) -> Arc<ServerState<FakeClock>> {
    static PARSED: OnceLock<Policy> = OnceLock::new();
    let policy = PARSED.get_or_init(|| {
        Policy::from_str(POLICY, "policy.yaml").expect("the fuzzing policy is valid")
    });
    let store = MemoryStore::with_clock(FakeClock::new(START));
    Arc::new(ServerState {
        enforcer: Arc::new(Enforcer::new(policy.clone(), AnyStore::Memory(store))),
        admin_token: Some(ADMIN_TOKEN.to_owned()),
        api_token: api_token.map(str::to_owned),
        metrics: None,
        reload_error: Default::default(),
        dashboard: None,
    })
}

/// Runs `future` to completion on this thread's runtime. The service never
/// waits on time or I/O with an in-memory store, so one thread suffices.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime");
    }
    RUNTIME.with(|rt| rt.block_on(future))
}
