//! Command-line arguments: the commands, each with the arguments its own
//! module declares.

use clap::{Parser, Subcommand};

use crate::bench::BenchArgs;
use crate::migrate::MigrateArgs;
use crate::replay::ReplayArgs;
use crate::simulate::SimulateArgs;
use crate::validate::ValidateArgs;
use sluice_server::proxy::ProxyArgs;
use sluice_server::serve::ServeArgs;

/// Sluice: exact rate limiting, as a library, a middleware and a server.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve the HTTP decision API, Envoy's rate limit service (gRPC) and
    /// Prometheus metrics.
    Serve(ServeArgs),
    /// Enforce a policy's rules in front of any HTTP upstream.
    Proxy(ProxyArgs),
    /// Load-test a running `sluice serve`, `sluice proxy` or any HTTP or
    /// gRPC rate limit service.
    Bench(BenchArgs),
    /// Check policy files; prints each error with its file, line and column.
    Validate(ValidateArgs),
    /// Run recorded events through a policy in virtual time, printing one
    /// decision (JSON) per event.
    Replay(ReplayArgs),
    /// Run a scenario (double-window, burst-then-steady, many-clients,
    /// thundering-herd, or one from a file) through every algorithm at one
    /// limit, and write report.html, its charts (SVG) and summary.json.
    Simulate(SimulateArgs),
    /// Make a PostgreSQL store's tables, or check that those there are of
    /// this release's version, before servers use them.
    Migrate(MigrateArgs),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("sluice").chain(args.iter().copied()))
            .map(|c| c.command)
    }

    // What each command's flags mean is tested beside the command; here,
    // that each command is reached by its name with its own flags.
    #[test]
    fn serve_may_go_without_a_policy() {
        assert!(matches!(parse(&["serve"]), Ok(Command::Serve(_))));
        assert!(matches!(
            parse(&["serve", "-p", "a.yaml", "--store", "memory"]),
            Ok(Command::Serve(_))
        ));
    }

    #[test]
    fn proxy_and_replay_refuse_to_start_without_a_policy() {
        for args in [
            &["proxy", "--upstream", "http://u"][..],
            &["replay", "-e", "-"],
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument, "{args:?}");
        }
        assert!(matches!(
            parse(&["proxy", "--upstream", "http://u", "--policy", "b.yaml"]),
            Ok(Command::Proxy(_))
        ));
    }
}
