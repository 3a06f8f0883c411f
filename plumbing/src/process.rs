//! The start-up both binaries share: signals, registry, readiness, client, admin server.

use std::{net::SocketAddr, time::Duration};

use clap::Args;

use kube::Client;
use prometheus::Registry;
use tokio::task::JoinHandle;

use crate::{
    Readiness, Shutdown,
    client::{KubeArgs, parse_duration},
    logging::telemetry::LogArgs,
    metrics,
    metrics_auth::{Delegated, MetricsAuth},
    serving::{
        self, Certificates,
        admin::{self, AdminArgs},
        self_signed,
    },
};

/// Runs `main` on a multi-threaded runtime, with glibc's malloc held to one arena first.
///
/// glibc gives a thread that meets a locked arena an arena of its own, up to eight per core,
/// and memory freed in one arena is not reused by another: at 10k Services, each model rebuild
/// under EndpointSlice churn landed in another worker's arena and the agent's RSS kept growing
/// under the `agent_scale` bench's churn; with one arena it grows far less. Our threads
/// allocate little and rarely at once, so the shared lock costs nothing measurable.
///
/// And with a fixed mmap threshold: by default glibc raises it to the size of every large block
/// it frees (up to 32 MiB), so after the first freed list page (a few MiB of JSON) every later
/// page is carved from the heap, and the small long-lived cache entries allocated between them
/// keep those pages resident. Fixed, blocks of 256 KiB and more are always mapped and unmapped.
pub fn run_main<F: std::future::Future<Output = std::process::ExitCode>>(
    main: impl FnOnce() -> F,
) -> std::process::ExitCode {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(main()),
        Err(e) => {
            eprintln!("starting the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Hands the heap's free pages back to the kernel (glibc's `malloc_trim`, which also releases
/// free pages inside the heap, not only at its top). A cache that listed 150k objects a page at
/// a time is left with pages freed between its long-lived entries, which free() alone keeps
/// resident; a component calls this after its bursts (PodGC: after each cycle).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks malloc's own free lists, under its lock.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The flags every groundskeeper binary takes.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Process")]
pub struct CommonArgs {
    /// Log every destructive action (deletions, finalizer removals, pod rejections) instead of
    /// making it. `--dry-run` alone or `--dry-run=true|false` (the chart passes the value).
    #[arg(long, env = "GROUNDSKEEPER_DRY_RUN", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub dry_run: bool,

    /// How long each stage of shutdown (draining tasks, releasing a lease) may take after
    /// SIGTERM before the process exits anyway.
    #[arg(long, env = "GROUNDSKEEPER_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// /readyz answers 503 while a watch has been failing (or relisting after a failure) for
    /// longer than this. Well above one retry (--watch-backoff-max plus a 10 s connect timeout)
    /// so a blip does not flap readiness; /healthz is not affected.
    #[arg(long, env = "GROUNDSKEEPER_WATCH_STALE_AFTER", default_value = "30s", value_parser = parse_duration)]
    pub watch_stale_after: Duration,

    /// Longest wait between two attempts to re-establish a failed watch (jittered down to half
    /// of it). Bounds how long after the apiserver returns a watch is back.
    #[arg(long, env = "GROUNDSKEEPER_WATCH_BACKOFF_MAX", default_value = "2s", value_parser = parse_duration)]
    pub watch_backoff_max: Duration,

    /// A watch that hears nothing from the server (no event, no bookmark, no answer) for this
    /// long is treated as failed (counted; its cache stale since it was last heard from) and
    /// watched again from its last resourceVersion, however healthy its connection looks.
    /// Every watch is asked to end after half of this, so a quiet one is heard from (the answer
    /// to its next watch) even when no bookmark comes. 0 turns the check off.
    #[arg(long, env = "GROUNDSKEEPER_WATCH_SILENT_AFTER", default_value = "90s", value_parser = parse_silent_after)]
    pub watch_silent_after: Duration,

    /// How each watch lists: `off` (the default) lists in pages; `auto` streams the list on
    /// the watch (sendInitialEvents, one request) and lists in pages from the first time the
    /// server cannot stream it (refused, or no end within --watch-list-timeout), logged and
    /// counted per watch; `on` only streams.
    #[arg(
        long,
        env = "GROUNDSKEEPER_WATCH_LIST",
        value_enum,
        default_value = "off"
    )]
    pub watch_list: crate::watch::list::WatchList,

    /// With --watch-list=auto: a streamed list that has not reached its end this long after it
    /// was asked for falls back to the paged list.
    #[arg(long, env = "GROUNDSKEEPER_WATCH_LIST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub watch_list_timeout: Duration,

    #[command(flatten)]
    pub log: LogArgs,

    #[command(flatten)]
    pub admin: AdminArgs,

    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Least `--watch-silent-after` (other than 0): a watch asked to end after half of it needs a few
/// seconds to be answered again before the bound.
const SILENT_AFTER_MIN: Duration = Duration::from_secs(6);

fn parse_silent_after(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !d.is_zero() && d < SILENT_AFTER_MIN {
        return Err(format!(
            "{s:?} is too short: at least {SILENT_AFTER_MIN:?}, or 0 to turn the check off"
        ));
    }
    Ok(d)
}

impl CommonArgs {
    pub fn watch_settings(&self) -> crate::WatchSettings {
        crate::WatchSettings {
            stale_after: self.watch_stale_after,
            backoff_max: self.watch_backoff_max,
            silent_after: self.watch_silent_after,
            list: self.watch_list,
            list_timeout: self.watch_list_timeout,
        }
    }
}

pub struct Process {
    pub shutdown: Shutdown,
    pub registry: Registry,
    pub readiness: Readiness,
    pub client: Client,
    /// `client`'s twin without automatic 429 retries (see `KubeArgs::clients`).
    pub unretried_client: Client,
    pub admin_addr: SocketAddr,
    admin_task: JoinHandle<std::io::Result<()>>,
}

/// What every task of either binary is handed, whatever it does: the client, where to
/// register metrics and watches, whether to act, and the one shutdown token.
#[derive(Clone)]
pub struct Base {
    pub client: Client,
    /// `client`'s twin on the same QPS budget without automatic 429 retries.
    pub unretried_client: Client,
    pub registry: Registry,
    pub readiness: Readiness,
    /// Log every destructive action that would be made; make none.
    pub dry_run: bool,
    pub token: tokio_util::sync::CancellationToken,
}

impl Process {
    /// The base for tasks that stop on `token` (the process's own, or a child of it).
    pub fn base(&self, dry_run: bool, token: tokio_util::sync::CancellationToken) -> Base {
        Base {
            client: self.client.clone(),
            unretried_client: self.unretried_client.clone(),
            registry: self.registry.clone(),
            readiness: self.readiness.clone(),
            dry_run,
            token,
        }
    }

    pub async fn start(args: &CommonArgs) -> anyhow::Result<Self> {
        let (kube, admin_addr) = (&args.kube, args.admin.admin_addr);
        let shutdown = Shutdown::new();
        shutdown.cancel_on_signals();
        let registry = metrics::registry();
        let readiness = Readiness::new(args.watch_settings());
        registry.register(readiness.collector())?;
        let (client, unretried_client) = kube.clients().await?;
        let auth = match args.admin.metrics_auth {
            MetricsAuth::None => None,
            // A client of its own: the checks callers cause neither spend nor wait behind
            // the budget the watches share.
            MetricsAuth::Kubernetes => Some(Delegated::new(
                kube.own_client("metrics-auth").await?,
                &registry,
            )?),
        };
        let tls = match args
            .admin
            .certificate_source()
            .map_err(anyhow::Error::msg)?
        {
            None => None,
            Some(source) => {
                let certs = std::sync::Arc::new(Certificates::default());
                self_signed::load(&source, &certs)
                    .map_err(|e| anyhow::anyhow!("the admin server's certificate: {e}"))?;
                tokio::spawn(self_signed::keep_current(
                    "admin server",
                    source,
                    certs.clone(),
                    shutdown.token(),
                ));
                Some(serving::server_config(certs)?)
            }
        };
        let (admin_addr, serve) = admin::bind(
            admin_addr,
            registry.clone(),
            readiness.clone(),
            auth,
            tls,
            shutdown.token(),
        )
        .await?;
        Ok(Self {
            shutdown,
            registry,
            readiness,
            client,
            unretried_client,
            admin_addr,
            admin_task: tokio::spawn(serve),
        })
    }

    /// Stops the admin server (it answers until every task has drained).
    pub async fn finish(self) {
        self.shutdown.trigger();
        match self.admin_task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "admin server ended with an error"),
            Err(e) => tracing::warn!(error = %e, "admin server task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn parse(args: &[&str]) -> Result<CommonArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bin").chain(args.iter().copied())).map(|c| c.common)
    }

    #[test]
    fn dry_run_alone_or_with_a_value() {
        assert!(!parse(&[]).unwrap().dry_run);
        assert!(parse(&["--dry-run"]).unwrap().dry_run);
        assert!(parse(&["--dry-run=true"]).unwrap().dry_run);
        assert!(!parse(&["--dry-run=false"]).unwrap().dry_run);
        assert!(parse(&["--dry-run=maybe"]).is_err());
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.shutdown_grace, Duration::from_secs(10));
        assert_eq!(c.admin.admin_addr.to_string(), "0.0.0.0:8080");
        assert_eq!(c.watch_stale_after, Duration::from_secs(30));
        assert_eq!(c.watch_backoff_max, Duration::from_secs(2));
        let c = parse(&["--watch-stale-after=1m", "--watch-backoff-max=500ms"]).unwrap();
        assert_eq!(c.watch_settings().stale_after, Duration::from_secs(60));
        assert_eq!(c.watch_settings().backoff_max, Duration::from_millis(500));
        assert!(parse(&["--watch-stale-after=soon"]).is_err());
        let c = parse(&[]).unwrap().watch_settings();
        assert_eq!(c.list, crate::watch::list::WatchList::Off);
        assert_eq!(c.list_timeout, Duration::from_secs(30));
        let c = parse(&["--watch-list=auto", "--watch-list-timeout=5s"]).unwrap();
        assert_eq!(c.watch_settings().list, crate::watch::list::WatchList::Auto);
        assert_eq!(c.watch_settings().list_timeout, Duration::from_secs(5));
        assert!(parse(&["--watch-list=maybe"]).is_err());
    }

    #[test]
    fn watch_silent_after() {
        let silent = |a: &[&str]| parse(a).map(|c| c.watch_settings().silent_after);
        assert_eq!(silent(&[]).unwrap(), Duration::from_secs(90));
        assert_eq!(
            silent(&["--watch-silent-after=10s"]).unwrap(),
            Duration::from_secs(10)
        );
        assert_eq!(silent(&["--watch-silent-after=0"]).unwrap(), Duration::ZERO);
        let e = silent(&["--watch-silent-after=2s"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("2s") && e.contains("too short"), "{e}");
    }
}
