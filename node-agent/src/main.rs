//! node-agent's entry point: flags, the node tasks started and drained in one stage.

use std::process::ExitCode;

use futures::FutureExt;

use groundskeeper_node_agent::agent::{self, Cli, Command, SysctlCommand};
use groundskeeper_node_agent::context::Context;
use groundskeeper_node_agent::{conntrack, sysctlreport};
use groundskeeper_plumbing::{
    life::{
        stages::{Stage, Stages},
        tasks::Tasks,
    },
    logging::klog::KObj,
    process::Process,
};

fn main() -> ExitCode {
    groundskeeper_plumbing::process::run_main(start)
}

async fn start() -> ExitCode {
    let cli = Cli::parse_as(agent::NAME, agent::ABOUT);
    // Subcommands are tools with their own stdout: they run before logging starts.
    if let Some(cmd) = cli.command {
        return match cmd {
            Command::Crd => {
                print!("{}", sysctlreport::crd::crd_yaml());
                ExitCode::SUCCESS
            }
            Command::Sysctl(SysctlCommand::Check(args)) => {
                ExitCode::from(sysctlreport::check::run(args))
            }
            Command::ConntrackSysctls(args) => {
                cli.common.log.init();
                let roots = conntrack::tuning::Roots::default();
                conntrack::tuning::apply_and_log(&args, &roots, cli.common.dry_run);
                ExitCode::SUCCESS
            }
        };
    }
    cli.common.log.init();
    let node_name = match cli.require_node_name() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = cli.conntrack.validate() {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    match run(cli, node_name).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "node-agent failed");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, node_name: String) -> anyhow::Result<()> {
    let process = Process::start(&cli.common).await?;
    tracing::info!(admin_addr = %process.admin_addr, node = KObj::cluster(&node_name).field(), dry_run = cli.common.dry_run, "node-agent starting");

    // One stage: whatever ended it, every task stops on the one token and gets the grace to
    // drain.
    let tasks = Stage::new("node tasks");
    let ctx = Context {
        base: process.base(cli.common.dry_run, tasks.token()),
        node_name,
    };
    let tasks = tasks.with(start_tasks(&cli, ctx));
    let mut stages = Stages::new([tasks]);
    let failed = stages.until_stopped(process.shutdown.cancelled()).await;
    stages.drain(cli.common.shutdown_grace).await;
    process.shutdown.trigger();
    process.finish().await;
    match failed {
        // Exit non-zero so the DaemonSet restarts the pod and the failure shows, rather than
        // an agent that looks healthy while one of its jobs is dead.
        Some(e) => Err(e),
        None => {
            tracing::info!("node-agent stopped");
            Ok(())
        }
    }
}

fn start_tasks(cli: &Cli, ctx: Context) -> Tasks {
    let conntrack = conntrack::run(ctx.clone(), cli.conntrack.clone());
    let sysctl = sysctlreport::run(ctx, cli.sysctl.clone());
    Tasks::start_selected(
        &cli.tasks,
        vec![("conntrack", conntrack.boxed()), ("sysctl", sysctl.boxed())],
        "no node tasks are enabled",
    )
}
