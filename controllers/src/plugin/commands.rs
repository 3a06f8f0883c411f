//! The answers of `why servicecidr`, `why pod` and `sysctl check`: read, decided with the
//! controllers' own code, and given as text and as the same facts structured.

use kube::Client;
use serde_json::json;

use super::output::Answer;
use super::{PodGcFlags, collected, manifest, read, settings, verdicts};
use crate::podgc::policy::NsPolicy;
use crate::servicecidr::blockers::{self, Blocking};
use crate::sysctl::facts::{CONDITION as PLACEMENT_CONDITION, GATE};
use collected::Settings;
use verdicts::PolicyFlags;

/// Events shown for a pod that is gone.
const EVENTS_SHOWN: usize = 10;

/// Most bytes read from a manifest.
const MAX_MANIFEST: u64 = 16 << 20;

pub fn read_manifest(
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

pub async fn why_servicecidr(client: &Client, name: &str) -> anyhow::Result<Answer> {
    let Some(read) = blockers::read(client.clone(), name).await? else {
        anyhow::bail!("servicecidrs.networking.k8s.io {name:?} not found");
    };
    let text = blockers::render(name, &read.cidrs, read.deleting, &read.blocking);
    let blocking: Vec<_> = match &read.blocking {
        Blocking::Blocked(found) => found
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
    Answer::new(
        text,
        &json!({
            "servicecidr": name,
            "cidrs": read.cidrs,
            "deleting": read.deleting,
            "blocked": matches!(read.blocking, Blocking::Blocked(_)),
            "coveredByAnother": read.blocking == Blocking::Covered,
            "blockers": blocking,
        }),
    )
}

pub async fn why_pod(
    client: &Client,
    ns: &str,
    name: &str,
    flags: &PodGcFlags,
    sysctl: &PolicyFlags,
) -> anyhow::Result<Answer> {
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
    // The controller-manager's own settings, where the user gave none.
    let (deployed, source) =
        settings::read(client, flags.controller_manager_namespace.as_deref()).await;
    let threshold = flags
        .terminated_pod_gc_threshold
        .unwrap_or(deployed.podgc.terminated_pod_gc_threshold);
    let ttl = flags
        .terminated_pod_ttl
        .unwrap_or(deployed.podgc.terminated_pod_ttl);
    let defaults = settings::parse(&[], &[])?;
    let sysctl = match format!("{sysctl:?}") == format!("{:?}", defaults.sysctl) {
        true => &deployed.sysctl,
        false => sysctl,
    };
    let settings = Settings {
        threshold,
        cluster_ttl: Some(ttl).filter(|d| !d.is_zero()),
        namespace: NsPolicy::parse(&read::ns_annotations(client, ns).await?),
    };
    let used = json!({
        "terminatedPodGcThreshold": threshold,
        "terminatedPodTtlSeconds": ttl.as_secs(),
        "allowedUnsafeSysctls": sysctl.allowed_unsafe_sysctls(),
        "sysctlDefaultMode": format!("{:?}", sysctl.sysctl_default_mode),
        "source": source,
    });
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
    let mut out = collected::render(&label, &podgc);
    if let Some(p) = &sysctls {
        out.push_str(&verdicts::render_pending(p));
    }
    out.push_str(&format!(
        "Settings: --terminated-pod-gc-threshold={threshold} --terminated-pod-ttl={}s, {}\n",
        ttl.as_secs(),
        match (&source.deployment, &source.note) {
            (Some(d), None) => format!("unless given, from Deployment {d}"),
            (Some(d), Some(n)) => format!("unless given, from Deployment {d} ({n})"),
            (None, n) => format!("unless given: {}", n.as_deref().unwrap_or_default()),
        }
    ));
    Answer::new(
        out,
        &json!({ "pod": label, "podgc": podgc, "sysctl": sysctls, "settings": used }),
    )
}

pub async fn sysctl_check(
    client: &Client,
    node: &str,
    pods: &[(String, k8s_openapi::api::core::v1::Pod)],
    flags: &PolicyFlags,
) -> anyhow::Result<Answer> {
    let Some(facts) = read::sysctl_node(client, node).await? else {
        anyhow::bail!("nodes {node:?} not found");
    };
    let policies = read::sysctl_policies(client).await?;
    let checks: Vec<verdicts::Check> = pods
        .iter()
        .map(|(label, pod)| verdicts::check(flags, label, pod, node, &facts, &policies))
        .collect();
    Answer::new(checks.iter().map(verdicts::render_check).collect(), &checks)
}
