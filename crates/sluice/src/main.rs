//! The `sluice` command. `main` only reports; the work is in [`sluice::run`].

use std::process::ExitCode;

use clap::Parser;

// A request through `serve` or `proxy` makes a few dozen short-lived
// allocations (headers, bodies, JSON); mimalloc's per-thread free lists serve
// them in a fraction of the instructions glibc's malloc takes, measured with
// callgrind per request.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    match sluice::run(sluice::cli::Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
