//! `sluice validate`: load each policy and report what is wrong with it.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use sluice_policy::Policy;

/// Arguments of `sluice validate`.
#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// Policy files (YAML or JSON).
    #[arg(required = true, env = "SLUICE_POLICY", value_delimiter = ',')]
    pub(crate) files: Vec<PathBuf>,
}

pub(crate) fn run(args: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let mut failed = false;
    for file in &args.files {
        match Policy::from_path(file) {
            Ok(policy) => {
                for w in policy.warnings() {
                    eprintln!("{w}");
                }
                writeln!(
                    out,
                    "{}: ok ({} limits, {} rules)",
                    file.display(),
                    policy.named_limits().len(),
                    policy.rules().len()
                )?;
            }
            Err(err) => {
                failed = true;
                eprintln!("{err}");
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
