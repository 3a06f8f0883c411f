//! `kubectl-groundskeeper`, the kubectl plugin: why a ServiceCIDR's deletion waits, why a pod
//! was collected (or not) and where its sysctls keep it off, and a node's sysctl verdict on a
//! manifest. It reads the API as the user's kubeconfig allows, with gets and lists only, and
//! answers with the controllers' own decision code, so it can not disagree with them.

pub mod collected;
#[cfg(test)]
mod collected_tests;
pub mod manifest;
pub mod read;
pub mod verdicts;

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};
use groundskeeper_plumbing::client::parse_duration;
use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde::Serialize;
use serde_json::json;

use crate::podgc::policy::NsPolicy;
use crate::servicecidr::blockers::{self, Verdict};
use crate::sysctl::facts::{CONDITION as PLACEMENT_CONDITION, GATE};
use collected::Settings;
use verdicts::PolicyFlags;

pub const NAME: &str = "kubectl-groundskeeper";

/// Exit codes: answered (whatever the answer says), or an error (nothing to answer about, the
/// API refused or unreachable, bad input).
pub const EXIT_ANSWERED: u8 = 0;
pub const EXIT_ERROR: u8 = 1;

/// Events shown for a pod that is gone.
const EVENTS_SHOWN: usize = 10;

#[derive(Parser, Debug)]
#[command(
    name = NAME,
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
    /// The pod's namespace; unset: the context's, else `default`.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// `text` for people, `json` for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "text")]
    pub output: Output,
    /// Deadline of each API request.
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Explain an object.
    #[command(subcommand)]
    Why(Why),
    /// Sysctl verdicts.
    #[command(subcommand)]
    Sysctl(Sysctl),
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

/// The controller-manager's PodGC flags the answer depends on: not in the API, so given here
/// (the same values as the controller-manager's; the defaults are its defaults).
#[derive(clap::Args, Debug, Clone)]
pub struct PodGcFlags {
    /// The controller-manager's `--terminated-pod-gc-threshold`.
    #[arg(long, default_value_t = 12500)]
    pub terminated_pod_gc_threshold: i64,
    /// The controller-manager's `--terminated-pod-ttl` (`0s`: off).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub terminated_pod_ttl: Duration,
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

/// The client, from `--kubeconfig`, `--context` and the usual places, as kubectl finds them;
/// and the namespace to use.
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
        Command::Sysctl(Sysctl::Check { file, .. }) => Some(read_manifest(file)?),
        _ => None,
    };
    let (client, ns) = client(cli).await?;
    let json = cli.output == Output::Json;
    match &cli.command {
        Command::Why(Why::ServiceCidr { name }) => why_servicecidr(&client, name, json).await,
        Command::Why(Why::Pod {
            name,
            podgc,
            sysctl,
        }) => why_pod(&client, &ns, name, podgc, sysctl, json).await,
        Command::Sysctl(Sysctl::Check { node, sysctl, .. }) => {
            let pods = manifest.unwrap_or_default();
            sysctl_check(&client, node, &pods, sysctl, json).await
        }
    }
}

/// Most bytes read from a manifest.
const MAX_MANIFEST: u64 = 16 << 20;

fn read_manifest(
    file: &std::path::Path,
) -> anyhow::Result<Vec<(String, k8s_openapi::api::core::v1::Pod)>> {
    use std::io::Read;
    let mut text = String::new();
    let reader: Box<dyn Read> = if file.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(
            std::fs::File::open(file)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?,
        )
    };
    reader
        .take(MAX_MANIFEST + 1)
        .read_to_string(&mut text)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
    if text.len() as u64 > MAX_MANIFEST {
        anyhow::bail!("{}: larger than {} MiB", file.display(), MAX_MANIFEST >> 20);
    }
    let pods = manifest::pods(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if pods.is_empty() {
        anyhow::bail!(
            "{}: no Pod or workload with a pod template in it",
            file.display()
        );
    }
    Ok(pods)
}

fn to_json(v: &impl Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(v)? + "\n")
}

async fn why_servicecidr(client: &Client, name: &str, json: bool) -> anyhow::Result<String> {
    let Some(read) = blockers::read(client.clone(), name).await? else {
        anyhow::bail!("servicecidrs.networking.k8s.io {name:?} not found");
    };
    if !json {
        return Ok(blockers::render(
            name,
            &read.cidrs,
            read.deleting,
            &read.verdict,
        ));
    }
    let blocking: Vec<_> = match &read.verdict {
        Verdict::Blocked(found) => found
            .iter()
            .map(|b| {
                json!({
                    "ip": &*b.entry.name,
                    "owner": b.entry.owner.as_ref().map(ToString::to_string),
                })
            })
            .collect(),
        _ => Vec::new(),
    };
    to_json(&json!({
        "servicecidr": name,
        "cidrs": read.cidrs,
        "deleting": read.deleting,
        "blocked": matches!(read.verdict, Verdict::Blocked(_)),
        "coveredByAnother": read.verdict == Verdict::Covered,
        "blockers": blocking,
    }))
}

async fn why_pod(
    client: &Client,
    ns: &str,
    name: &str,
    flags: &PodGcFlags,
    sysctl: &PolicyFlags,
    json: bool,
) -> anyhow::Result<String> {
    let label = format!("{ns}/{name}");
    let Some(pod) = read::pod(client, ns, name).await? else {
        // Events are a help, not the answer: a user who may not list them still learns
        // the pod is gone.
        let events = read::pod_events(client, ns, name, EVENTS_SHOWN)
            .await
            .unwrap_or_default();
        let mut msg = format!(
            "pods {name:?} not found in namespace {ns:?}. If PodGC collected it, the API keeps \
             no record of which pass did (PodGC, like kube-controller-manager's, records no \
             Event per pod): the controller-manager's log line `force-deleted pod` with \
             pod=\"{label}\" names the pass and the time."
        );
        if !events.is_empty() {
            msg.push_str("\nEvents about it still kept:\n  ");
            msg.push_str(&events.join("\n  "));
        }
        anyhow::bail!(msg);
    };
    let settings = Settings {
        threshold: flags.terminated_pod_gc_threshold,
        cluster_ttl: Some(flags.terminated_pod_ttl).filter(|d| !d.is_zero()),
        namespace: NsPolicy::parse(&read::ns_annotations(client, ns).await?),
    };
    // Counting lists every terminated pod's metadata: only when a threshold can use it.
    let count = settings.threshold > 0 || settings.namespace.threshold().is_some();
    let state = read::pod_state(client, &pod, count).await?;
    let podgc = collected::explain(&state, &settings, jiff::Timestamp::now());
    let spec = pod.spec.as_ref();
    let pending = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
        && spec
            .and_then(|s| s.node_name.as_deref())
            .is_none_or(str::is_empty)
        && pod.metadata.deletion_timestamp.is_none();
    let sysctls = if pending {
        let gated = spec
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| g.iter().any(|g| g.name == GATE));
        let held = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == PLACEMENT_CONDITION))
            .filter(|c| c.status == "False")
            .map(|c| {
                format!(
                    "{} {}",
                    c.reason.as_deref().unwrap_or_default(),
                    c.message.as_deref().unwrap_or_default()
                )
            });
        let sets = !verdicts::sysctl_names(spec).is_empty();
        let (nodes, policies) = match sets {
            true => (
                read::sysctl_nodes(client).await?,
                read::sysctl_policies(client).await?,
            ),
            false => Default::default(),
        };
        Some(verdicts::pending(
            sysctl, &label, &pod, gated, held, &nodes, &policies,
        ))
    } else {
        None
    };
    if json {
        return to_json(&json!({ "pod": label, "podgc": podgc, "sysctl": sysctls }));
    }
    let mut out = collected::render(&label, &podgc);
    if let Some(p) = &sysctls {
        out.push_str(&verdicts::render_pending(p));
    }
    Ok(out)
}

async fn sysctl_check(
    client: &Client,
    node: &str,
    pods: &[(String, k8s_openapi::api::core::v1::Pod)],
    flags: &PolicyFlags,
    json: bool,
) -> anyhow::Result<String> {
    let Some(facts) = read::sysctl_node(client, node).await? else {
        anyhow::bail!("nodes {node:?} not found");
    };
    let policies = read::sysctl_policies(client).await?;
    let checks: Vec<verdicts::Check> = pods
        .iter()
        .map(|(label, pod)| verdicts::check(flags, label, pod, node, &facts, &policies))
        .collect();
    if json {
        return to_json(&checks);
    }
    Ok(checks.iter().map(verdicts::render_check).collect())
}
