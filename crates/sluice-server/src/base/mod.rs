//! What `serve` and `proxy` both run on: the store chosen at start-up, the
//! policy put in force over it and reloaded, the metrics recorder, the
//! operational endpoints, who may call them, logging, and the signal that
//! stops a server.
//! Neither command imports the other; both import this.

mod access;
mod endpoints;
mod logs;
mod metrics;
mod reload;
mod signals;
mod store;

pub use metrics::Metrics;
pub use store::AnyStore;
pub use store::StoreChoice;
pub(crate) use store::report_first_answer;

pub(crate) use access::{foreign_page, holds_token, is_address, is_json, not_json};
pub(crate) use endpoints::{clip, metrics_page, problem, readiness, ready};
pub(crate) use logs::init_logs;
pub(crate) use reload::{Loaded, Reloads};
pub(crate) use signals::{Stop, shutdown_signal};

/// The runtime a server runs on: as many worker threads as `threads` says.
///
/// With one thread it is tokio's current-thread scheduler, which runs the
/// server's own future and every task it spawns on the calling thread. A
/// multi-thread scheduler with a single worker would run the accept loops
/// on the calling thread and the connections on the worker: two busy
/// threads on one CPU, handing work across; `docs/performance.md` has what
/// that cost a request.
pub fn runtime(threads: &crate::flags::Threads) -> std::io::Result<tokio::runtime::Runtime> {
    let n = threads.get();
    let mut builder = if n == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(n);
        b
    };
    builder.enable_all().build()
}

/// Runs `server` to its end on a [`runtime`] of `threads`, then stops the
/// runtime without waiting for its blocking pool: a read still under way
/// there (of a policy file on a disk that hangs, say) must not keep a
/// stopped server from exiting within its shutdown timeout.
pub(crate) fn block_on<T>(
    threads: &crate::flags::Threads,
    server: impl Future<Output = T>,
) -> std::io::Result<T> {
    let runtime = runtime(threads)?;
    let done = runtime.block_on(server);
    runtime.shutdown_background();
    Ok(done)
}

/// Publishes `sluice_runtime_workers{scheduler}`: how many threads run the
/// server's tasks, and on which scheduler (`current_thread` or
/// `multi_thread`), so that an operator sees what `--threads`, or the CPUs
/// it defaulted to, chose. Called on the runtime, once the recorder is
/// installed.
pub(crate) fn publish_runtime() {
    let handle = tokio::runtime::Handle::current();
    let scheduler = match handle.runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => "current_thread",
        _ => "multi_thread",
    };
    ::metrics::gauge!("sluice_runtime_workers", "scheduler" => scheduler)
        .set(handle.metrics().num_workers() as f64);
}

#[cfg(test)]
mod tests {
    use tokio::runtime::RuntimeFlavor;

    use super::runtime;
    use crate::flags::Threads;

    fn on(count: Option<usize>) -> tokio::runtime::Runtime {
        runtime(&Threads { count }).unwrap()
    }

    #[test]
    fn one_thread_runs_the_single_threaded_scheduler() {
        let rt = on(Some(1));
        assert_eq!(rt.handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        // Spawned tasks run while the server's future is driven.
        assert_eq!(
            rt.block_on(async { tokio::spawn(async { 7 }).await.unwrap() }),
            7
        );
    }

    /// A blocking task that never ends, such as a read stuck on a disk,
    /// must not keep the server's end waiting: the runtime is left to it.
    #[test]
    fn a_server_ends_while_a_blocking_task_still_runs() {
        let (ended, end) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Kept until after the server's end, so the task runs past it.
            let (_hold, stuck) = std::sync::mpsc::channel::<()>();
            let done = super::block_on(&Threads { count: Some(1) }, async move {
                let (started, running) = tokio::sync::oneshot::channel();
                tokio::task::spawn_blocking(move || {
                    let _ = started.send(());
                    let _ = stuck.recv();
                });
                running.await.unwrap();
                7
            });
            let _ = ended.send(done.unwrap());
        });
        let waited = end.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(
            waited,
            Ok(7),
            "the server's end waited for the blocking task"
        );
    }

    #[test]
    fn several_threads_run_that_many_workers() {
        let rt = on(Some(3));
        assert_eq!(rt.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        assert_eq!(rt.metrics().num_workers(), 3);
    }

    #[test]
    fn without_a_count_there_is_a_thread_for_each_cpu_the_process_may_use() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let rt = on(None);
        assert_eq!(rt.metrics().num_workers(), cpus);
        let flavor = if cpus == 1 {
            RuntimeFlavor::CurrentThread
        } else {
            RuntimeFlavor::MultiThread
        };
        assert_eq!(rt.handle().runtime_flavor(), flavor);
    }
}
