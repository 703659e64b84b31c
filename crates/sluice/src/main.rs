//! The `sluice` command. `main` only reports; the work is in [`sluice::run`].

use std::process::ExitCode;

use clap::Parser;

// A request through `serve` or `proxy` makes a few dozen short-lived
// allocations (headers, bodies, JSON), which jemalloc's per-thread caches
// serve without a lock. Its background threads give memory that stays free
// back to the system on a timer, even while the workers sit idle: a server
// whose memory a flood of connections raised comes back down after it
// (docs/bounds.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // Without them, freed pages are only returned when some thread
    // allocates again; a failure only means memory is kept longer.
    let _ = tikv_jemalloc_ctl::background_thread::write(true);
    match sluice::run(sluice::cli::Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
