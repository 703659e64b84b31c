//! Policy hot reload, shared by `serve` and `proxy`: the file is watched
//! for new contents and re-read on SIGHUP, and a policy that fails to
//! compile never replaces the one in force.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use sluice_core::Store;
use sluice_engine::Enforcer;
use sluice_policy::{Policy, PolicyError, StoreConfig};

use super::store::AnyStore;
use crate::flags::StoreFlag;

/// How often the policy file is looked at for changes.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The policy a server starts with, and the file it came from, if any.
pub(crate) struct Loaded {
    policy: Policy,
    /// The file and the text it held, which the watch compares new reads
    /// with.
    file: Option<(PathBuf, String)>,
}

impl Loaded {
    /// Reads and compiles the policy file a server starts with, and logs
    /// what it warns about.
    pub(crate) fn read(path: &Path) -> Result<Loaded, PolicyError> {
        let text = Policy::read(path)?;
        let policy = Policy::from_str(&text, path)?;
        log_warnings(&policy);
        Ok(Loaded {
            policy,
            file: Some((path.to_owned(), text)),
        })
    }

    /// A policy with no file behind it, which never reloads.
    pub(crate) fn fixed(policy: Policy) -> Loaded {
        Loaded { policy, file: None }
    }

    /// Opens the store that `store` or the policy names and puts the policy
    /// in force over it.
    pub(crate) fn enforce(
        self,
        store: &StoreFlag,
    ) -> anyhow::Result<(Enforcer<AnyStore>, Reloads)> {
        let Loaded { policy, file } = self;
        let opened = AnyStore::open(store.choice.as_deref(), policy.store())?;
        // What a reloaded policy's `store` is compared with.
        let running = store.choice.is_none().then(|| policy.store().clone());
        Ok((Enforcer::new(policy, opened), Reloads { file, running }))
    }
}

fn log_warnings(policy: &Policy) {
    for w in policy.warnings() {
        tracing::warn!("{w}");
    }
}

/// What reloading a server's policy needs: the file to watch, and the
/// store section the store was opened from (`None` when `--store` chose
/// it).
pub(crate) struct Reloads {
    file: Option<(PathBuf, String)>,
    running: Option<StoreConfig>,
}

impl Reloads {
    /// Watches the policy file, when there is one, and hands each new
    /// version to `apply`, which says where it goes with [`Change::apply`].
    pub(crate) fn spawn(self, mut apply: impl FnMut(Change<'_>) + Send + 'static) {
        let Some((path, text)) = self.file else {
            return;
        };
        let running = self.running;
        tokio::spawn(watch(path, text, move |path, text| {
            apply(Change {
                path,
                text,
                running: running.as_ref(),
            });
        }));
    }
}

/// A new version of the policy file, or why it could not be read.
pub(crate) struct Change<'a> {
    path: &'a Path,
    text: Result<&'a str, &'a PolicyError>,
    running: Option<&'a StoreConfig>,
}

/// Reloads the policy when the file's contents change, and on SIGHUP.
///
/// The file is read by path each time, so in-place writes, atomic renames
/// and Kubernetes' ConfigMap symlink swaps all show up as new contents; the
/// contents, not timestamps, decide whether anything changed. A file that
/// cannot be read twice running (deleted, say, rather than caught mid-swap)
/// is reported through `apply` as an error, once, until it is back.
async fn watch(
    path: PathBuf,
    mut current: String,
    mut apply: impl FnMut(&Path, Result<&str, &PolicyError>) + Send + 'static,
) {
    let mut unreadable = 0u32;
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let forced = {
            let hup_recv = async {
                match hup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep(WATCH_EVERY) => false,
                () = hup_recv => true,
            }
        };
        #[cfg(not(unix))]
        let forced = {
            tokio::time::sleep(WATCH_EVERY).await;
            false
        };
        let text = match Policy::read(&path) {
            Ok(text) => text,
            Err(e) => {
                // Once may be a swap caught halfway; twice is not.
                unreadable = unreadable.saturating_add(1);
                if unreadable == 2 || forced {
                    apply(&path, Err(&e));
                }
                continue;
            }
        };
        let back = std::mem::take(&mut unreadable) >= 2;
        if text == current && !forced && !back {
            continue;
        }
        apply(&path, Ok(&text));
        current = text;
    }
}

impl Change<'_> {
    /// Puts the new version in force if it is a valid policy; otherwise
    /// keeps the old one and says why on `/readyz`, in the logs and in a
    /// metric.
    ///
    /// The store is opened once, at start-up, so a new `store` section cannot
    /// take effect. When the new policy names another than the store was
    /// opened from, the rest of it is put in force, and a warning and the
    /// `sluice_policy_store_restart_pending` gauge say a restart is needed.
    ///
    /// A policy with neither rules nor limits does not replace one that has
    /// some unless it says so (`rules: []`): an editor that empties a file
    /// before writing it, or a copy cut short, would otherwise drop every
    /// limit at once.
    pub(crate) fn apply<S: Store + 'static>(
        self,
        enforcer: &Enforcer<S>,
        error: &ArcSwapOption<String>,
    ) {
        let Change {
            path,
            text,
            running,
        } = self;
        let compiled = text.map_err(Clone::clone).and_then(|text| {
            let policy = Policy::from_str(text, path)?;
            if policy.is_empty() && !policy.is_empty_on_purpose() && !enforcer.policy().is_empty() {
                return Err(PolicyError {
                    file: path.to_owned(),
                    line: 0,
                    column: 0,
                    message: "the policy has no rules and no limits, and would drop every one \
                              in force; if that is meant, say `rules: []`"
                        .into(),
                });
            }
            Ok(policy)
        });
        match compiled {
            Ok(policy) => {
                log_warnings(&policy);
                let pending = running.is_some_and(|r| r != policy.store());
                ::metrics::gauge!("sluice_policy_store_restart_pending")
                    .set(f64::from(u8::from(pending)));
                if pending {
                    tracing::warn!(
                        path = %path.display(),
                        "the policy names a different store; the store is opened at start-up, so \
                         this store keeps serving until a restart"
                    );
                }
                enforcer.replace(policy);
                error.store(None);
                ::metrics::counter!("sluice_policy_reloads_total", "result" => "ok").increment(1);
                ::metrics::gauge!("sluice_policy_reload_failed").set(0.0);
                tracing::info!(path = %path.display(), "policy reloaded");
            }
            Err(e) => {
                ::metrics::counter!("sluice_policy_reloads_total", "result" => "error")
                    .increment(1);
                ::metrics::gauge!("sluice_policy_reload_failed").set(1.0);
                tracing::error!(error = %e, "policy reload failed; the previous policy stays in force");
                error.store(Some(Arc::new(e.to_string())));
            }
        }
    }
}
