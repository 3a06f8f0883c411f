//! controller-manager's entry point: flags, leader election, and the process's stages (the
//! controllers, the webhook, the election) started and drained in order.

use std::process::ExitCode;

use futures::FutureExt;
use groundskeeper_controllers::{
    context::Context,
    leader::{self, ElectionConfig, Elector, LeaderMetrics, Leadership},
    manager::{self, Cli, Command, ServiceCidrCommand},
    podgc, servicecidr,
    sysctl::{cache::Watched, placement, webhook},
    uninstall,
};
use groundskeeper_plumbing::{
    events::Events,
    life::{
        stages::{Stage, Stages},
        tasks::Tasks,
    },
    process::Process,
};

fn main() -> ExitCode {
    groundskeeper_plumbing::process::run_main(start)
}

async fn start() -> ExitCode {
    let cli = Cli::parse_as(manager::NAME, manager::ABOUT);
    // Subcommands are tools with their own stdout: they run before logging starts.
    if let Some(Command::Probe(args)) = &cli.command {
        return ExitCode::from(groundskeeper_plumbing::serving::probe::run(args).await);
    }
    if let Some(command) = &cli.command {
        let client = match cli.common.kube.client().await {
            Ok(client) => client,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        };
        return ExitCode::from(match command {
            Command::Servicecidr(ServiceCidrCommand::Blockers(args)) => {
                servicecidr::blockers::run(client, args).await
            }
            Command::Uninstall(args) => uninstall::run(client, args, cli.common.dry_run).await,
            // Answered above, before a client is made; the same answer here.
            Command::Probe(args) => groundskeeper_plumbing::serving::probe::run(args).await,
        });
    }
    cli.common.log.init();
    if let Err(e) = cli
        .election
        .validate()
        .and_then(|()| cli.webhook.validate())
        .and_then(|()| podgc::PodGcArgs::refuse_retired_env(|k| std::env::var(k).ok()))
    {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "controller-manager failed");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let process = Process::start(&cli.common).await?;
    let shutdown = process.shutdown.clone();
    let registry = process.registry.clone();
    tracing::info!(admin_addr = %process.admin_addr, dry_run = cli.common.dry_run, "controller-manager starting");

    let is_leader = LeaderMetrics::register(&registry, &cli.election.leader_elect_lease_name)?;

    // The process's stages, drained in this order: the controllers, so that nothing acts once
    // the lease is released; the webhook, which answers for as long as anything can act; the
    // leader election last, which releases the lease.
    let controllers = Stage::new("controllers");
    let mut webhook = Stage::new("webhook");
    let mut election = Stage::new("leader election");

    let leadership = if cli.election.leader_elect {
        let e = &cli.election;
        let cfg = ElectionConfig {
            lease_name: e.leader_elect_lease_name.clone(),
            namespace: e.leader_elect_namespace.clone(),
            identity: leader::identity(e.leader_elect_identity.as_deref().unwrap_or(&hostname())),
            lease_duration: e.leader_elect_lease_duration,
            renew_deadline: e.leader_elect_renew_deadline,
            retry_period: e.leader_elect_retry_period,
        };
        // Its own client: renewals never wait behind the controllers' QPS budget.
        let mut kube = cli.common.kube.clone();
        if let Some(path) = &e.leader_elect_kubeconfig {
            kube.kubeconfig = Some(path.clone());
        }
        let lease_client = kube.lease_client().await?;
        // client-go's LeaderElection Events on the Lease, written by the elector's client.
        let events = Events::new(
            lease_client.clone(),
            leader::events::reporter(),
            cli.common.dry_run,
        );
        let (elector, leadership) = Elector::new(lease_client, cfg, is_leader);
        let elector = elector.recording(events);
        // It ends on its own only when the lease is lost: the process then stops, as
        // kube-controller-manager does.
        let token = election.token();
        election.tasks().spawn(
            "leader-election",
            async move { Ok(elector.run(token).await?) },
        );
        leadership
    } else {
        is_leader.set(true);
        tracing::info!("leader election disabled: acting as the only replica");
        Leadership::always()
    };

    // The webhook serves on every replica, leader or not. Its pod lookups have a client of
    // their own: what callers of the webhook port cause never spends the controllers' QPS
    // budget.
    let lookups = match cli.webhook.enabled {
        true => Some(cli.common.kube.own_client("sysctl-webhook").await?),
        false => None,
    };
    let webhook_ctx = Context {
        base: process.base(cli.common.dry_run, webhook.token()),
        leadership: leadership.clone(),
    };
    // The sysctl watches (Nodes, SysctlPolicies, pods not yet bound), once per process for the
    // webhook and the placement alike, only where one of them runs. In the webhook's stage:
    // they outlive the controllers, and answer the webhook until it stops.
    let sysctl = (cli.webhook.enabled || cli.controllers.has(PLACEMENT)).then(|| {
        let base = &webhook_ctx.base;
        let (watched, run) = Watched::new(&base.readiness, &base.client, base.token.clone());
        webhook.tasks().spawn("sysctl", run);
        watched
    });
    start_webhook(webhook.tasks(), &cli, webhook_ctx, lookups, sysctl.clone());
    let ctx = Context {
        base: process.base(cli.common.dry_run, controllers.token()),
        leadership,
    };
    let controllers = controllers.with(start_controllers(&cli, ctx, sysctl));

    // Run until SIGTERM, a lost lease, or a controller (or the webhook) that ends on its own;
    // then every stage drains in turn, each within the grace.
    let mut stages = Stages::new([controllers, webhook, election]);
    let failed = stages.until_stopped(shutdown.cancelled()).await;
    stages.drain(cli.common.shutdown_grace).await;
    shutdown.trigger();
    process.finish().await;
    if let Some(reason) = failed {
        // As kube-controller-manager does: exit, and let the pod restart clean as a standby.
        tracing::error!(reason = %format!("{reason:#}"), "stopped all controllers; exiting");
        return Ok(ExitCode::FAILURE);
    }
    tracing::info!("controller-manager stopped");
    Ok(ExitCode::SUCCESS)
}

/// The placement's `--controllers` name.
const PLACEMENT: &str = "sysctlplacement";

/// `sysctl`: the sysctl watches, there whenever the placement is selected.
fn start_controllers(cli: &Cli, ctx: Context, sysctl: Option<Watched>) -> Tasks {
    let servicecidr = servicecidr::run(ctx.clone(), cli.service_cidr.clone());
    let podgc = podgc::run(ctx.clone(), cli.podgc.clone());
    let mut parts = vec![
        ("servicecidr", servicecidr.boxed()),
        ("podgc", podgc.boxed()),
    ];
    if let Some(watched) = sysctl {
        let placement = placement::run(ctx, cli.placement.clone(), cli.sysctl.clone(), watched);
        parts.push((PLACEMENT, placement.boxed()));
    }
    Tasks::start_selected(
        &cli.controllers,
        parts,
        "no controllers are enabled; the manager only holds the lease",
    )
}

/// `sysctl`: the sysctl watches, there whenever the webhook is enabled.
fn start_webhook(
    tasks: &mut Tasks,
    cli: &Cli,
    ctx: Context,
    lookups: Option<kube::Client>,
    sysctl: Option<Watched>,
) {
    if let (Some(lookups), Some(watched)) = (lookups.filter(|_| cli.webhook.enabled), sysctl) {
        tasks.spawn(
            "sysctlwebhook",
            webhook::run(
                ctx,
                cli.webhook.clone(),
                cli.sysctl.clone(),
                lookups,
                watched,
            ),
        );
    }
}

fn hostname() -> String {
    groundskeeper_plumbing::client::host_name().unwrap_or_else(|| "controller-manager".into())
}
