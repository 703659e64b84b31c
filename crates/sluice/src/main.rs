//! The `sluice` command. `main` only reports; the work is in [`sluice::run`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    match sluice::run(sluice::cli::Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
