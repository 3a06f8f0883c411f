//! Every API call the plugin makes: gets and lists only, turned into the plain values the
//! explanations read. Nothing here writes.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectList},
    core::PartialObjectMeta,
};

use super::collected::{Disruption, NodeSeen, PodState};
use super::verdicts::SysctlPolicy;
use crate::podgc::{
    facts::{DISRUPTION_TARGET, Interner, NodeFacts, NsAnnotations, PodFacts},
    policy::{THRESHOLD_ANNOTATION, TTL_ANNOTATION},
    wire::{WireNode, WirePod},
};
use crate::sysctl::facts::NodeFacts as SysctlNode;

/// Pages of this many objects, as PodGC lists.
const PAGE: u32 = 500;

/// `Ok(None)` for a 404, the object otherwise.
async fn get_opt<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get(name).await {
        Ok(o) => Ok(Some(o)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// The pod, or `None` when there is no such pod.
pub async fn pod(client: &Client, ns: &str, name: &str) -> Result<Option<Pod>, kube::Error> {
    get_opt(&Api::<Pod>::namespaced(client.clone(), ns), name).await
}

/// What PodGC would see of `pod`: its facts parsed by PodGC's own code from the same object,
/// its node (a live GET, as the orphan pass makes), and, when `count` (a threshold is in
/// force) and it is terminated itself, the terminated pods counted.
pub async fn pod_state(client: &Client, pod: &Pod, count: bool) -> anyhow::Result<PodState> {
    let wire: WirePod = serde_json::from_value(serde_json::to_value(pod)?)?;
    let facts = PodFacts::from_wire(wire, &mut Interner::default())?;
    let node = match facts.node_name.as_deref() {
        None => NodeSeen::Unbound,
        Some(n) => match get_opt(&Api::<WireNode>::all(client.clone()), n).await? {
            None => NodeSeen::Missing,
            Some(node) => NodeSeen::Present(NodeFacts::from_wire(&node)),
        },
    };
    let disruption = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == DISRUPTION_TARGET))
        .filter(|c| c.status == "True")
        .map(|c| Disruption {
            reason: c.reason.clone().unwrap_or_default(),
            since: c.last_transition_time.as_ref().map(|t| t.0),
        });
    let terminated = match count && facts.phase.is_terminated() {
        true => Some(terminated_counts(client, facts.namespace()).await?),
        false => None,
    };
    Ok(PodState {
        deletion_timestamp: pod.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        finalizers: pod.finalizers().to_vec(),
        disruption,
        node,
        terminated,
        facts,
    })
}

/// Terminated pods (phase not Pending, Running or Unknown: upstream's definition) in the
/// cluster and in `ns`: a paged list of metadata only, filtered by the apiserver.
pub async fn terminated_counts(client: &Client, ns: &str) -> Result<(usize, usize), kube::Error> {
    let api = Api::<Pod>::all(client.clone());
    let mut params = ListParams::default()
        .fields("status.phase!=Pending,status.phase!=Running,status.phase!=Unknown")
        .limit(PAGE);
    let (mut all, mut here) = (0, 0);
    loop {
        let page: ObjectList<PartialObjectMeta<Pod>> = api.list_metadata(&params).await?;
        all += page.items.len();
        here += page
            .items
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
            .count();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok((all, here)),
        }
    }
}

/// The namespace's two PodGC policy annotations (none when the namespace can not be read:
/// the pod exists, so it does, and a 404 here is a race with its deletion).
pub async fn ns_annotations(client: &Client, ns: &str) -> Result<NsAnnotations, kube::Error> {
    let Some(n) = get_opt(&Api::<Namespace>::all(client.clone()), ns).await? else {
        return Ok(NsAnnotations::default());
    };
    let a = n.annotations();
    Ok(NsAnnotations {
        ttl: a.get(TTL_ANNOTATION).map(|v| v.as_str().into()),
        threshold: a.get(THRESHOLD_ANNOTATION).map(|v| v.as_str().into()),
    })
}

/// The latest Events about pod `name` in `ns`, newest last, at most `max`.
pub async fn pod_events(
    client: &Client,
    ns: &str,
    name: &str,
    max: usize,
) -> Result<Vec<String>, kube::Error> {
    let params = ListParams::default()
        .fields(&format!(
            "involvedObject.kind=Pod,involvedObject.name={name}"
        ))
        .limit(PAGE);
    let mut events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&params)
        .await?
        .items;
    let when = |e: &Event| -> Option<Timestamp> {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    events.sort_by_key(|e| when(e));
    let skip = events.len().saturating_sub(max);
    Ok(events
        .iter()
        .skip(skip)
        .map(|e| {
            format!(
                "{} {} {}: {}",
                when(e)
                    .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                    .unwrap_or_default(),
                e.type_.as_deref().unwrap_or_default(),
                e.reason.as_deref().unwrap_or_default(),
                e.message.as_deref().unwrap_or_default().trim()
            )
        })
        .collect())
}

/// One node, as the sysctl webhook reads it; `None` when there is no such node.
pub async fn sysctl_node(client: &Client, name: &str) -> Result<Option<SysctlNode>, kube::Error> {
    let node = get_opt(&Api::<Node>::all(client.clone()), name).await?;
    Ok(node.as_ref().map(SysctlNode::of))
}

/// Every node, as the sysctl webhook reads it, by name.
pub async fn sysctl_nodes(client: &Client) -> Result<Vec<(String, SysctlNode)>, kube::Error> {
    let mut out = Vec::new();
    let api = Api::<Node>::all(client.clone());
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        out.extend(page.items.iter().map(|n| (n.name_any(), SysctlNode::of(n))));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(out),
        }
    }
}

/// Every SysctlPolicy; none when the CRD is not installed (404).
pub async fn sysctl_policies(client: &Client) -> Result<Vec<SysctlPolicy>, kube::Error> {
    match Api::<SysctlPolicy>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}
