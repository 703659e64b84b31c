//! What `serve` and `proxy` both answer about themselves, and the state
//! they answer it from: [`ServerState`], and the operations routes
//! (`/metrics`, `/healthz`, `/readyz`, the dashboard's `/ui` and
//! `/v1/stats`). `serve` adds its decision API to these; `proxy` answers
//! them on its admin listener. Above the dashboard and `server`, below the
//! two commands.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{MethodRouter, get};
use sluice_core::{Clock, SystemClock};
use sluice_engine::Enforcer;

use crate::base::{AnyStore, Metrics, Reloads, metrics_page, readiness};
use crate::dashboard::{self, Dashboard};

/// A running server's state: the policy and the store, the tokens that
/// guard its calls, and what it shows about itself.
pub struct ServerState<C = SystemClock> {
    /// The policy and the store.
    pub enforcer: Arc<Enforcer<AnyStore<C>>>,
    /// The token the dashboard and `/v1/reset` require; `None` leaves the
    /// dashboard open and disables `/v1/reset`. It does whatever the API
    /// token does too.
    pub admin_token: Option<String>,
    /// The token that the privileged parts of a decision call need
    /// (`serve`'s `force`, `reserve`, a limit brought inline, and
    /// `/v1/refund`); `None` leaves them open to every caller. `proxy`
    /// makes no such calls.
    pub api_token: Option<String>,
    /// The Prometheus exposition, when a recorder is installed.
    pub metrics: Option<Metrics>,
    /// Why the last policy reload failed, while the old policy serves.
    pub reload_error: ArcSwapOption<String>,
    /// The live dashboard (`/ui`, `/v1/stats`); `None` answers them 404.
    pub dashboard: Option<Arc<Dashboard>>,
}

impl ServerState {
    /// The state `serve` and `proxy` start from, once their policy is in
    /// force on `enforcer`: it reports the first answer of the store the
    /// log calls `store`, publishes the runtime's workers, and puts each
    /// reload of the policy file into force. An empty token is none.
    pub(crate) fn start(
        enforcer: Arc<Enforcer<AnyStore>>,
        store: String,
        reloads: Reloads,
        dashboard: Option<Arc<Dashboard>>,
        (admin_token, api_token): (Option<String>, Option<String>),
    ) -> Arc<Self> {
        crate::base::report_first_answer(&enforcer, store);
        let state = Arc::new(ServerState {
            dashboard,
            enforcer,
            admin_token: admin_token.filter(|t| !t.is_empty()),
            api_token: api_token.filter(|t| !t.is_empty()),
            metrics: Metrics::global(),
            reload_error: ArcSwapOption::empty(),
        });
        crate::base::publish_runtime();
        let reloaded = Arc::clone(&state);
        reloads.spawn(move |change| change.apply(&reloaded.enforcer, &reloaded.reload_error));
        state
    }
}

/// The operations routes, on any router whose state is a
/// [`ServerState`].
pub(crate) fn routes<C: Clock + Send + Sync + 'static>()
-> [(&'static str, MethodRouter<Arc<ServerState<C>>>); 5] {
    [
        ("/metrics", get(metrics::<C>)),
        ("/healthz", get(|| async { "ok\n" })),
        ("/readyz", get(readyz::<C>)),
        (dashboard::UI, get(ui::<C>)),
        (dashboard::STATS, get(stats::<C>)),
    ]
}

async fn metrics<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
) -> Response {
    metrics_page(s.metrics.as_ref(), s.enforcer.store())
}

async fn readyz<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
) -> Response {
    readiness(s.enforcer.store(), &s.reload_error)
}

async fn ui<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    headers: HeaderMap,
) -> Response {
    dashboard::page(s.dashboard.as_deref(), s.admin_token.as_deref(), &headers)
}

async fn stats<C: Clock + Send + Sync + 'static>(
    State(s): State<Arc<ServerState<C>>>,
    headers: HeaderMap,
) -> Response {
    dashboard::stats(
        s.dashboard.as_deref(),
        s.admin_token.as_deref(),
        &headers,
        &s.enforcer,
        &s.reload_error,
    )
}
