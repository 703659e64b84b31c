//! The `sluice` command. `main` only reports; the work starts in [`run`].

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod replay;
mod validate;

fn main() -> ExitCode {
    match run(cli::Cli::parse()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: cli::Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        cli::Command::Validate(args) => validate::run(&args),
        cli::Command::Replay(args) => replay::run(&args).map(|()| ExitCode::SUCCESS),
    }
}
