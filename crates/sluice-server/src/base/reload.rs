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

use super::store::{AnyStore, StoreChoice};
use crate::flags::StoreFlag;

/// How often the policy file is looked at for changes.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The policy a server starts with, and where it came from.
pub(crate) struct Loaded {
    policy: Policy,
    source: Source,
}

enum Source {
    /// The file and the text it held, which the watch compares new reads
    /// with.
    File(PathBuf, String),
    /// No file, and what the log calls the policy.
    Fixed(&'static str),
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
            source: Source::File(path.to_owned(), text),
        })
    }

    /// A policy with no file behind it, which never reloads; the log calls
    /// it `what`.
    pub(crate) fn fixed(policy: Policy, what: &'static str) -> Loaded {
        Loaded {
            policy,
            source: Source::Fixed(what),
        }
    }

    /// Opens the store that `store` or the policy names and puts the policy
    /// in force over it. The log says which policy and which store, so
    /// that no one has to guess what a server runs; the store's name is
    /// returned for [`report_first_answer`](super::store::report_first_answer).
    pub(crate) fn enforce(
        self,
        store: &StoreFlag,
    ) -> anyhow::Result<(Enforcer<AnyStore>, Reloads, String)> {
        let Loaded { policy, source } = self;
        let (limits, rules) = (policy.named_limits().len(), policy.rules().len());
        let file = match source {
            Source::File(path, text) => {
                tracing::info!(file = %path.display(), limits, rules, "the policy in force");
                Some((path, text))
            }
            Source::Fixed(what) => {
                tracing::info!(file = what, limits, rules, "the policy in force");
                None
            }
        };
        let choice = StoreChoice::of(store.choice.as_deref(), store.timeout, policy.store())?;
        let name = choice.to_string();
        tracing::info!(store = %name, "the store in use");
        let opened = AnyStore::open_choice(&choice)?;
        // What a reloaded policy's `store` is compared with.
        let running = store.choice.is_none().then(|| policy.store().clone());
        Ok((
            Enforcer::new(policy, opened),
            Reloads { file, running },
            name,
        ))
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
        tokio::spawn(watch(path, text, move |path, compiled| {
            apply(Change {
                path,
                compiled,
                running: running.as_ref(),
            });
        }));
    }
}

/// A new version of the policy file, compiled, or why it could not be read
/// or compiled.
pub(crate) struct Change<'a> {
    path: &'a Path,
    compiled: Result<Policy, PolicyError>,
    running: Option<&'a StoreConfig>,
}

/// Reloads the policy when the file's contents change, and on SIGHUP.
///
/// The file is read by path each time, so in-place writes, atomic renames
/// and Kubernetes' ConfigMap symlink swaps all show up as new contents; the
/// contents, not timestamps, decide whether anything changed. A file that
/// cannot be read twice running (deleted, say, rather than caught mid-swap)
/// is reported through `apply` as an error, once, until it is back or
/// cannot be read for another reason.
///
/// Reading the file, and compiling it, which reads the key files it names,
/// run on the blocking pool: a slow disk or a file that is not what it
/// should be must never hold a thread that answers requests.
async fn watch(
    path: PathBuf,
    mut current: String,
    mut apply: impl FnMut(&Path, Result<Policy, PolicyError>) + Send + 'static,
) {
    let mut unreadable = 0u32;
    // The read error last reported, while the file stays unreadable.
    let mut reported: Option<String> = None;
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
        let read = {
            let path = path.clone();
            off_the_workers(move || Policy::read(&path)).await
        };
        let Some(read) = read else { return };
        let text = match read {
            Ok(text) => text,
            Err(e) => {
                // Once may be a swap caught halfway; twice is not. A file
                // that then fails for another reason says so: the reason
                // shown must be the one that holds now.
                unreadable = unreadable.saturating_add(1);
                let why = e.to_string();
                if forced || (unreadable >= 2 && reported.as_ref() != Some(&why)) {
                    reported = Some(why);
                    apply(&path, Err(e));
                }
                continue;
            }
        };
        unreadable = 0;
        let back = reported.take().is_some();
        if text == current && !forced && !back {
            continue;
        }
        let compiled = {
            let (path, text) = (path.clone(), text.clone());
            off_the_workers(move || Policy::from_str(&text, &path)).await
        };
        let Some(compiled) = compiled else { return };
        apply(&path, compiled);
        current = text;
    }
}

/// Runs `read` on the blocking pool and waits for it; `None` when the
/// runtime is shutting down and dropped it.
async fn off_the_workers<T: Send + 'static>(
    read: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    match tokio::task::spawn_blocking(read).await {
        Ok(done) => Some(done),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
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
            compiled,
            running,
        } = self;
        let compiled = compiled.and_then(|policy| {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The watch on a paused clock: each look at the file comes as soon as
    /// the last is done, and a report is waited for at most a minute of
    /// virtual time (sixty looks).
    struct Watched {
        reports: tokio::sync::mpsc::UnboundedReceiver<Result<usize, String>>,
    }

    impl Watched {
        fn start(path: &Path, text: &str) -> Watched {
            let (tx, reports) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(watch(
                path.to_owned(),
                text.to_owned(),
                move |_, compiled| {
                    let _ = tx.send(compiled.map(|p| p.rules().len()).map_err(|e| e.to_string()));
                },
            ));
            Watched { reports }
        }

        async fn next(&mut self) -> Result<usize, String> {
            tokio::time::timeout(Duration::from_secs(60), self.reports.recv())
                .await
                .expect("nothing reported within a minute")
                .expect("the watch ended")
        }
    }

    const ONE_RULE: &str = "rules:\n  - name: r\n    limit_keys: []\n    \
                            algorithm: token_bucket\n    algorithm_config: {rps: 1}\n";

    #[tokio::test(start_paused = true)]
    async fn a_file_that_fails_again_for_another_reason_reports_the_new_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, ONE_RULE).unwrap();
        let mut watched = Watched::start(&path, ONE_RULE);

        std::fs::remove_file(&path).unwrap();
        let gone = watched.next().await.unwrap_err();
        assert!(gone.contains("No such file"), "{gone}");
        std::fs::create_dir(&path).unwrap();
        let dir_now = watched.next().await.unwrap_err();
        assert!(
            dir_now.contains("a directory, not a regular file"),
            "{dir_now}"
        );

        // The same text back is put in force again, clearing the error.
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, ONE_RULE).unwrap();
        assert_eq!(watched.next().await, Ok(1));

        // A policy that does not compile, then one that fails otherwise.
        std::fs::write(&path, ONE_RULE.replace("rps: 1", "rps: -1")).unwrap();
        let bad = watched.next().await.unwrap_err();
        assert!(bad.contains("`rps` must be a positive number"), "{bad}");
        std::fs::write(&path, ONE_RULE.replace("rps: 1", "rps: 1, burst: -2")).unwrap();
        let worse = watched.next().await.unwrap_err();
        assert!(worse.contains("`burst`"), "{worse}");
    }
}
