//! kubectl-groundskeeper's entry point: `kubectl groundskeeper ...` once it is on the PATH.

use std::process::ExitCode;

use clap::Parser;
use groundskeeper_controllers::plugin::{self, Cli};

fn main() -> ExitCode {
    // Parsed before the runtime starts: `--help` and a bad flag cost nothing.
    let cli = Cli::parse();
    groundskeeper_plumbing::process::run_main(
        || async move { ExitCode::from(plugin::run(cli).await) },
    )
}
