//! The live dashboard of `serve` and `proxy --admin`: `/ui`, one page
//! served from the binary, drawn from `/v1/stats`, a JSON document that
//! other tools can read as well. A task samples the enforcer's running
//! totals once a second and keeps the last five minutes; the keys denied
//! most are kept by the engine in bounded memory.
//!
//! Both are behind the admin token when the server has one. A browser
//! shows its own login prompt for them: the token goes in the password
//! field (any user name), since a page cannot be opened with a bearer
//! token.

mod history;

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sluice_core::{Clock, Store};
use sluice_engine::Enforcer;
use sluice_policy::{Policy, readable_key};

use crate::base::{AnyStore, holds_token, is_address, problem, ready};
use history::History;

/// The path of the page.
pub(crate) const UI: &str = "/ui";
/// The path of its data.
pub(crate) const STATS: &str = "/v1/stats";

/// How many of the most denied keys `/v1/stats` lists.
const TOP: usize = 20;
/// How often a sample is taken.
const EVERY: Duration = Duration::from_secs(1);
/// How many samples make a minute, when the top keys start a new one.
const PER_MINUTE: u32 = 60;

const PAGE: &str = include_str!("page.html");

/// The samples of one enforcer's activity, and the file its policy came
/// from.
pub struct Dashboard {
    history: Mutex<History>,
    policy_file: Option<PathBuf>,
}

impl Dashboard {
    /// Starts sampling `enforcer` once a second, on the current tokio
    /// runtime, for as long as the dashboard is kept; also makes the
    /// enforcer keep its most denied keys.
    pub fn start<S: Store + 'static>(
        enforcer: &Arc<Enforcer<S>>,
        policy_file: Option<PathBuf>,
    ) -> Arc<Dashboard> {
        enforcer.keep_top_keys();
        let dashboard = Arc::new(Dashboard {
            history: Mutex::default(),
            policy_file,
        });
        dashboard.sample(enforcer);
        // Made now, not when the task first runs, so that the samples keep
        // time from this first one.
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::spawn(sample(
            tick,
            Arc::downgrade(&dashboard),
            Arc::clone(enforcer),
        ));
        dashboard
    }

    fn sample<S: Store + 'static>(&self, enforcer: &Enforcer<S>) {
        let reading = enforcer.activity();
        self.history.lock().push(reading, SystemTime::now());
    }

    fn document<S: Store + 'static>(
        &self,
        enforcer: &Enforcer<S>,
        policy: &Policy,
        ready: Result<(), String>,
        reload_error: Option<Arc<String>>,
    ) -> Value {
        let history = self.history.lock();
        let seconds: Vec<f64> = history.seconds.iter().map(|s| unix(s.at)).collect();
        let decisions: Vec<Value> = history
            .totals()
            .into_iter()
            .map(|r| {
                let id = (r.rule.clone(), r.enforcement);
                let each = |pick: fn((u64, u64)) -> u64| -> Vec<u64> {
                    history
                        .seconds
                        .iter()
                        .map(|s| s.decisions.get(&id).copied().map_or(0, pick))
                        .collect()
                };
                json!({
                    "rule": r.rule,
                    "mode": r.enforcement.as_str(),
                    "allowed": each(|(a, _)| a),
                    "denied": each(|(_, d)| d),
                    "allowed_total": r.allowed,
                    "denied_total": r.denied,
                })
            })
            .collect();
        let store = json!({
            "calls": history.seconds.iter().map(|s| s.store.calls()).collect::<Vec<_>>(),
            "errors": history.seconds.iter().map(|s| s.store.errors).collect::<Vec<_>>(),
            "p50_seconds": history.seconds.iter().map(|s| s.store.quantile(0.5)).collect::<Vec<_>>(),
            "p99_seconds": history.seconds.iter().map(|s| s.store.quantile(0.99)).collect::<Vec<_>>(),
        });
        let held = json!({
            "now": enforcer.activity().held,
            "each_second": history.seconds.iter().map(|s| s.held).collect::<Vec<_>>(),
        });
        drop(history);
        let top = enforcer.keep_top_keys().top(TOP);
        let top_keys: Vec<Value> = top
            .into_iter()
            .map(|t| {
                // A rule's keys are composite; a named limit's are the
                // caller's own.
                let rule = policy.rules().iter().find(|r| r.name() == t.rule);
                let key = if rule.is_some() {
                    readable_key(&t.key)
                } else {
                    t.key
                };
                json!({
                    "rule": t.rule,
                    "mode": t.enforcement.as_str(),
                    "key": key,
                    "denied": t.denied,
                    "overcount": t.overcount,
                })
            })
            .collect();
        let describe = |name: &str, limit: &sluice_core::Limit| {
            json!({
                "name": name,
                "algorithm": limit.algorithm().name(),
                "limit": limit.algorithm().capacity(),
                "window_seconds": limit.algorithm().quota_window(),
            })
        };
        let rules: Vec<Value> = policy
            .rules()
            .iter()
            .map(|r| {
                let mut d = describe(r.name(), r.limit());
                d["mode"] = r.enforcement().as_str().into();
                d["domain"] = r.domain().into();
                d
            })
            .collect();
        let limits: Vec<Value> = policy
            .named_limits()
            .iter()
            .map(|l| describe(l.name(), l.limit()))
            .collect();
        let since = enforcer.policy_since();
        json!({
            "time": unix(SystemTime::now()),
            "ready": ready.is_ok(),
            "not_ready_because": ready.err(),
            "policy": {
                "file": self.policy_file.as_ref().map(|p| p.display().to_string()),
                "since": humantime::format_rfc3339_millis(since).to_string(),
                "reload_error": reload_error.as_deref(),
                "rules": rules,
                "limits": limits,
            },
            "seconds": seconds,
            "decisions": decisions,
            "store": store,
            "held": held,
            "top_keys": {
                "minutes": sluice_engine::MINUTES,
                "keys": top_keys,
            },
        })
    }
}

/// `/ui`: the page, a 401 that makes a browser ask for the token, or a 404
/// when the server runs no dashboard.
pub(crate) fn page(
    dashboard: Option<&Dashboard>,
    token: Option<&str>,
    headers: &HeaderMap,
) -> Response {
    if dashboard.is_none() {
        return no_dashboard();
    }
    if let Some(denied) = unauthorized(token, headers) {
        return denied;
    }
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            // The page loads nothing and talks only to its own server.
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
                ),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        PAGE,
    )
        .into_response()
}

/// `/v1/stats`: the samples, the policy in force and readiness; or a 401,
/// or a 404 when the server runs no dashboard.
pub(crate) fn stats<C: Clock + Send + Sync + 'static>(
    dashboard: Option<&Dashboard>,
    token: Option<&str>,
    headers: &HeaderMap,
    enforcer: &Enforcer<AnyStore<C>>,
    reload_error: &ArcSwapOption<String>,
) -> Response {
    let Some(dashboard) = dashboard else {
        return no_dashboard();
    };
    if let Some(denied) = unauthorized(token, headers) {
        return denied;
    }
    let policy = enforcer.policy();
    let doc = dashboard.document(
        enforcer,
        &policy,
        ready(enforcer.store(), reload_error),
        reload_error.load_full(),
    );
    let mut res = axum::Json(doc).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

fn no_dashboard() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "this server runs no dashboard".into(),
    )
}

/// Samples `enforcer` into `dashboard` each second until the dashboard is
/// dropped; each minute, the top keys start a new minute.
async fn sample<S: Store + 'static>(
    mut tick: tokio::time::Interval,
    dashboard: Weak<Dashboard>,
    enforcer: Arc<Enforcer<S>>,
) {
    // The first tick is at once, and a sample was just taken.
    tick.tick().await;
    let mut ticks = 0u32;
    loop {
        tick.tick().await;
        let Some(dashboard) = dashboard.upgrade() else {
            return;
        };
        dashboard.sample(&enforcer);
        ticks += 1;
        if ticks.is_multiple_of(PER_MINUTE) {
            enforcer.keep_top_keys().rotate();
        }
    }
}

/// `t` in seconds since the Unix epoch.
fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A 401 unless `headers` carry `token` (when there is one), as a bearer
/// token or as the password of HTTP basic authentication; the challenge
/// names both, so that a browser asks for it.
///
/// Without a token, a 403 for a request addressed (`Host`) to a name other
/// than `localhost`: a web page can point a name of its own at this
/// server's address (DNS rebinding) and read the answers, keys and all.
fn unauthorized(token: Option<&str>, headers: &HeaderMap) -> Option<Response> {
    let Some(token) = token else {
        let host = headers.get(header::HOST).map(|h| h.to_str().unwrap_or(""));
        if host.is_none_or(is_address) {
            return None;
        }
        return Some(problem(
            StatusCode::FORBIDDEN,
            "without an admin token the dashboard answers only requests addressed to an IP \
             address or localhost; open it by address, or start the server with --admin-token"
                .into(),
        ));
    };
    if holds_token(token, headers, true) {
        return None;
    }
    let mut res = problem(
        StatusCode::UNAUTHORIZED,
        "the dashboard needs the admin token: `Authorization: Bearer <token>`, or in a browser, \
         the token as the password"
            .into(),
    );
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"sluice\", charset=\"UTF-8\""),
    );
    Some(res)
}
