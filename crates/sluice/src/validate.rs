//! `sluice validate`: load each policy and report what is wrong with it.

use std::io::Write;
use std::process::ExitCode;

use sluice_policy::Policy;

use crate::cli::ValidateArgs;

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
                    policy.limits().len(),
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
