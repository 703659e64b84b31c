//! The `sluice` command: `serve` (HTTP decision API, Envoy RLS and
//! metrics), `proxy`, `bench`, `validate`, `replay`, `simulate` and
//! `migrate`. The binary parses arguments and calls [`run`]. The two
//! servers are the `sluice-server` crate's; the offline commands are here.

use std::process::ExitCode;

mod bench;
mod chart;
pub mod cli;
mod html;
mod migrate;
mod replay;
mod simulate;
mod validate;

use sluice_server::{proxy, serve};

// The README's and the docs' Rust examples, run as doctests so that none
// shows code that does not compile or does not do what the page says
// (`cargo test --doc -p sluice`). This crate depends on every crate the
// pages show.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
pub struct LibraryExamples;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/middleware.md")]
pub struct MiddlewareExamples;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/stores.md")]
pub struct StoresExamples;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/postgres.md")]
pub struct PostgresExamples;

/// Runs one command line.
pub fn run(cli: cli::Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        cli::Command::Validate(args) => validate::run(&args),
        cli::Command::Replay(args) => replay::run(&args).map(|()| ExitCode::SUCCESS),
        cli::Command::Simulate(args) => simulate::run(&args).map(|()| ExitCode::SUCCESS),
        cli::Command::Serve(args) => serve::run(args).map(|()| ExitCode::SUCCESS),
        cli::Command::Proxy(args) => proxy::run(args).map(|()| ExitCode::SUCCESS),
        cli::Command::Bench(args) => bench::run(args).map(|()| ExitCode::SUCCESS),
        cli::Command::Migrate(args) => migrate::run(&args),
    }
}
