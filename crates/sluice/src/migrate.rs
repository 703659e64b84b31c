//! `sluice migrate`: makes a PostgreSQL store's tables, or checks that
//! those there are of the version this release reads, before any server
//! uses them: for a deployment whose servers' database role may not create
//! tables, or that wants the change made once, by hand.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use sluice_policy::{Policy, StoreConfig};
use sluice_postgres::PostgresStore;

use sluice_server::StoreChoice;
use sluice_server::flags::{PolicyFile, StoreFlag};

/// Arguments of `sluice migrate`.
#[derive(Debug, Args)]
#[command(mut_arg("policy", |policy| policy
    .required(false)
    .help("The policy whose store to migrate; --store names one instead")))]
pub(crate) struct MigrateArgs {
    #[command(flatten)]
    pub(crate) policy: Option<PolicyFile>,
    #[command(flatten)]
    pub(crate) store: StoreFlag,
    /// How long to wait for the database, its connection and the
    /// migration's lock (another server may be making the tables).
    #[arg(long, value_name = "DURATION", default_value = "30s",
          value_parser = sluice_server::duration::parse)]
    pub(crate) timeout: Duration,
}

pub(crate) fn run(args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    if args.store.choice.is_none() && args.policy.is_none() {
        anyhow::bail!("name the store to migrate: --store postgres://… or --policy FILE");
    }
    let policy = match &args.policy {
        Some(file) => Some(Policy::from_path(&file.path)?),
        None => None,
    };
    let memory = StoreConfig::default();
    let configured = policy.as_ref().map_or(&memory, Policy::store);
    let choice = StoreChoice::of(args.store.choice.as_deref(), args.store.timeout, configured)?;
    let Some(config) = choice.postgres() else {
        writeln!(
            std::io::stdout().lock(),
            "{choice}: nothing to migrate; only a PostgreSQL store keeps tables"
        )?;
        return Ok(ExitCode::SUCCESS);
    };
    let config = config.clone().with_timeout(args.timeout);
    let shown = config.to_string();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = PostgresStore::new(config)?;
        match tokio::time::timeout(args.timeout, store.migrate()).await {
            Ok(Ok(())) => {
                writeln!(
                    std::io::stdout().lock(),
                    "{shown}: the tables are at version {}",
                    sluice_postgres::SCHEMA_VERSION
                )?;
                Ok(ExitCode::SUCCESS)
            }
            Ok(Err(e)) => anyhow::bail!("{shown}: {e}"),
            Err(_) => anyhow::bail!(
                "{shown}: no answer within {}",
                humantime::format_duration(args.timeout)
            ),
        }
    })
}
