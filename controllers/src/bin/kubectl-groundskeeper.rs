//! kubectl-groundskeeper's entry point: `kubectl groundskeeper ...` once it is on the PATH.

use std::process::ExitCode;

use clap::Parser;
use groundskeeper_controllers::plugin::{self, Cli};

fn main() -> ExitCode {
    // kubectl's plugin completion (through `kubectl_complete-groundskeeper`): no client.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(plugin::completion::COMPLETE) {
        print!("{}", plugin::completion::complete(&args[1..]));
        return ExitCode::SUCCESS;
    }
    // Parsed before the runtime starts: `--help` and a bad flag cost nothing. A usage error
    // exits 1 like every other error (clap's own code is 2); `--help` and `--version` exit 0.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                plugin::EXIT_ERROR
            } else {
                0
            });
        }
    };
    groundskeeper_plumbing::process::run_main(
        || async move { ExitCode::from(plugin::run(cli).await) },
    )
}
