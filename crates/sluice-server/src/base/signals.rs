//! The signals that stop a server: SIGTERM or Ctrl-C.

use tokio::sync::watch;

/// One stop for every listener of a process: the first signal ends them
/// all, and each lets its requests in flight finish.
pub(crate) struct Stop(watch::Receiver<bool>);

impl Stop {
    /// Starts waiting for the signal, on the current runtime.
    pub(crate) fn on_signal() -> Stop {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = tx.send(true);
        });
        Stop(rx)
    }

    /// Completes once the signal has come; one for each listener.
    pub(crate) fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
    }
}

/// Completes on SIGTERM or Ctrl-C.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("stopping: finishing requests in flight");
}
