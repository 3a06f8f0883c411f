//! `kubectl-groundskeeper`, the kubectl plugin: why a ServiceCIDR's deletion waits, why a pod
//! was collected (or not) and where its sysctls keep it off, and a node's sysctl verdict on a
//! manifest. It reads the API as the user's kubeconfig allows, with gets and lists only, and
//! answers with the controllers' own decision code, so it can not disagree with them.

pub mod collected;
#[cfg(test)]
mod collected_tests;
pub mod commands;
pub mod completion;
pub mod get;
pub mod manifest;
pub mod output;
pub mod read;
pub mod settings;
pub mod verdicts;

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use groundskeeper_plumbing::client::parse_duration;
use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

pub use output::Output;
use verdicts::PolicyFlags;

pub const NAME: &str = "kubectl-groundskeeper";

/// Exit codes: answered (whatever the answer says), or an error (nothing to answer about, the
/// API refused or unreachable, bad input).
pub const EXIT_ANSWERED: u8 = 0;
pub const EXIT_ERROR: u8 = 1;

#[derive(Parser, Debug)]
#[command(
    name = NAME,
    bin_name = "kubectl groundskeeper",
    version,
    about = "Ask groundskeeper why: what blocks a ServiceCIDR's deletion, why PodGC collected a \
             pod (or not), which nodes' sysctl verdicts keep a pod off. Reads the API only."
)]
pub struct Cli {
    /// Path to the kubeconfig; unset: KUBECONFIG, else ~/.kube/config, else in-cluster.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; unset: its current context.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Act as this user (or `system:serviceaccount:NS:NAME`), as kubectl's `--as`: the
    /// kubeconfig's user needs the right to impersonate.
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// A group to act as, with `--as`; repeat for more.
    #[arg(
        long = "as-group",
        global = true,
        value_name = "GROUP",
        requires = "as_user"
    )]
    pub as_group: Vec<String>,
    /// The UID to act as, with `--as`.
    #[arg(
        long = "as-uid",
        global = true,
        value_name = "UID",
        requires = "as_user"
    )]
    pub as_uid: Option<String>,
    /// The pod's namespace; unset: the context's, else `default`.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// `text` for people (a table or sentences), `json` or `yaml`: the same facts for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "text")]
    pub output: Output,
    /// Deadline of each API request.
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List objects with what kubectl's own printer leaves out.
    #[command(subcommand)]
    Get(Get),
    /// Explain an object.
    #[command(subcommand)]
    Why(Why),
    /// Sysctl verdicts.
    #[command(subcommand)]
    Sysctl(Sysctl),
    /// Print a shell completion script for the `kubectl-groundskeeper` executable (see
    /// docs/plugin.md for `kubectl groundskeeper` completion through kubectl).
    Completion { shell: completion::Shell },
}

#[derive(Subcommand, Debug)]
pub enum Get {
    /// ServiceCIDRs (every one, or those named): NAME, CIDRS, READY (the `Ready` condition's
    /// status and reason), FINALIZER, BLOCKED BY (while deleting: how many IPAddresses keep
    /// it, and the first few), AGE.
    #[command(name = "servicecidrs", visible_aliases = ["servicecidr"])]
    ServiceCidrs { names: Vec<String> },
}

#[derive(Subcommand, Debug)]
pub enum Why {
    /// What blocks (or would block) the deletion of ServiceCIDR NAME.
    #[command(name = "servicecidr")]
    ServiceCidr { name: String },
    /// Whether PodGC collected pod NAME, by which pass and when (or what each pass says of
    /// it); for a Pending pod, which nodes' sysctl verdicts keep it off.
    Pod {
        name: String,
        #[command(flatten)]
        podgc: PodGcFlags,
        #[command(flatten)]
        sysctl: PolicyFlags,
    },
}

/// The controller-manager's PodGC flags the answer depends on: unset, read from its Deployment
/// in the cluster (`settings.rs`), else its defaults; given, they override.
#[derive(clap::Args, Debug, Clone)]
pub struct PodGcFlags {
    /// The controller-manager's `--terminated-pod-gc-threshold` (unset: its Deployment's, else
    /// 12500).
    #[arg(long, allow_negative_numbers = true)]
    pub terminated_pod_gc_threshold: Option<i64>,
    /// The controller-manager's `--terminated-pod-ttl` (`0s`: off; unset: its Deployment's,
    /// else off).
    #[arg(long, value_parser = parse_duration)]
    pub terminated_pod_ttl: Option<Duration>,
    /// Where the controller-manager's Deployment is (its release's namespace); unset: the
    /// first found in any namespace.
    #[arg(long, value_name = "NAMESPACE")]
    pub controller_manager_namespace: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Sysctl {
    /// The verdict of node NODE on the pods of a manifest: from its SysctlPolicies, its
    /// kernel and kubelet versions, as the admission webhook judges them.
    Check {
        /// The manifest (Pod, or a workload's pod template; multi-document YAML); `-` is stdin.
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        /// The node to judge on.
        #[arg(long)]
        node: String,
        #[command(flatten)]
        sysctl: PolicyFlags,
    },
}

/// Parses the command line, answers, and returns the exit code.
pub async fn run(cli: Cli) -> u8 {
    if let Command::Completion { shell } = cli.command {
        print!("{}", completion::script(shell));
        return EXIT_ANSWERED;
    }
    match answer(&cli).await {
        Ok(text) => {
            print!("{text}");
            EXIT_ANSWERED
        }
        Err(e) => {
            eprintln!("error: {}", said(&e));
            EXIT_ERROR
        }
    }
}

/// An error as the user reads it: what the apiserver answered, and what to do about a refusal.
pub fn said(e: &anyhow::Error) -> String {
    let api = e
        .chain()
        .find_map(|c| match c.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(s)) => Some(s),
            _ => None,
        });
    match api {
        Some(s) if s.code == 403 => format!(
            "forbidden: {} ({NAME} needs get and list on pods, nodes, namespaces, events, \
             servicecidrs, ipaddresses and sysctlpolicies: see docs/plugin.md)",
            s.message
        ),
        Some(s) if s.code == 401 => format!(
            "unauthorized: {} (check the kubeconfig's credentials)",
            s.message
        ),
        _ => format!("{e:#}"),
    }
}

/// The client, from `--kubeconfig`, `--context` and the usual places, as kubectl finds them,
/// acting as `--as`, `--as-group` and `--as-uid` say; and the namespace to use.
pub async fn client(cli: &Cli) -> anyhow::Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..KubeConfigOptions::default()
    };
    let mut config = match &cli.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("reading kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &options).await?
        }
        None if cli.context.is_some() => Config::from_kubeconfig(&options).await?,
        None => Config::infer().await?,
    };
    // As kubectl: the flags replace whatever impersonation the kubeconfig's user sets.
    if let Some(user) = &cli.as_user {
        config.auth_info.impersonate = Some(user.clone());
        config.auth_info.impersonate_groups = Some(cli.as_group.clone()).filter(|g| !g.is_empty());
        config.auth_info.impersonate_uid = cli.as_uid.clone();
    }
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(cli.request_timeout);
    config.write_timeout = Some(cli.request_timeout);
    // The apiserver's audit log and metrics then name the plugin.
    let agent = format!("{NAME}/{}", env!("CARGO_PKG_VERSION"));
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&agent)?,
    ));
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((Client::try_from(config)?, namespace))
}

async fn answer(cli: &Cli) -> anyhow::Result<String> {
    // The manifest is read before any API call: bad input costs nothing.
    let manifest = match &cli.command {
        Command::Sysctl(Sysctl::Check { file, .. }) => Some(commands::read_manifest(file)?),
        _ => None,
    };
    let (client, ns) = client(cli).await?;
    let answer = match &cli.command {
        Command::Get(Get::ServiceCidrs { names }) => {
            let rows = get::servicecidrs(&client, names).await?;
            get::answer(&rows, jiff::Timestamp::now())?
        }
        Command::Why(Why::ServiceCidr { name }) => commands::why_servicecidr(&client, name).await?,
        Command::Why(Why::Pod {
            name,
            podgc,
            sysctl,
        }) => commands::why_pod(&client, &ns, name, podgc, sysctl).await?,
        Command::Sysctl(Sysctl::Check { node, sysctl, .. }) => {
            let pods = manifest.unwrap_or_default();
            commands::sysctl_check(&client, node, &pods, sysctl).await?
        }
        Command::Completion { .. } => unreachable!("answered in run, before any client"),
    };
    answer.print(cli.output)
}
