//! The thin layer: watches this node's pods, the SysctlPolicies and this Node, and applies what
//! `decide` says (fail a pod that has not started and warn in Enforce, warn in Audit, only
//! report a started pod), and keeps each policy's status current.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use prometheus::{IntCounter, IntCounterVec, Opts};
use serde_json::json;
use tokio::time::Instant;

use super::SysctlArgs;
use super::allowlist::FORBIDDEN_REASON;
use super::crd::{Mode, SysctlPolicy};
use super::decide::{Action, Memory, PodFacts, decide, outcome, report_event_name};
use super::kernel::KernelVersion;
use super::policy::{NodePolicy, desired_status, merge};
use super::safe::safe_sysctls;
use crate::context::Context;
use groundskeeper_plumbing::{ReadyFlag, watch::watch_store};

pub use crate::context::MANAGER;
/// kubelet's `rejectPod` prefix on the pod status message (the event carries the bare message).
pub const STATUS_MESSAGE_PREFIX: &str = "Pod was rejected: ";

/// How often failed writes are retried and delayed status writes come due.
const TICK: Duration = Duration::from_secs(1);
/// Status writes are spread over this window by node name, so that of many agents seeing the
/// same policy change, the first write is seen by most before their own turn comes.
const STATUS_SPREAD_MS: u64 = 5_000;

pub struct Metrics {
    checked: IntCounter,
    rejected: IntCounterVec,
    started_forbidden: IntCounterVec,
}

impl Metrics {
    pub fn register(registry: &prometheus::Registry) -> anyhow::Result<Self> {
        let checked = IntCounter::new(
            "groundskeeper_sysctl_pods_checked_total",
            "Pods bound to this node whose sysctls were checked (once per change of sysctls or outcome).",
        )?;
        let rejected = IntCounterVec::new(
            Opts::new(
                "groundskeeper_sysctl_pods_rejected_total",
                "Pods found to use forbidden sysctls, by reason and mode (Enforce: failed; Audit: warned).",
            ),
            &["reason", "mode"],
        )?;
        let started_forbidden = IntCounterVec::new(
            Opts::new(
                "groundskeeper_sysctl_started_pods_forbidden_total",
                "Started pods (kubelet admitted them) that the node's policy would forbid, by the mode \
                 in force; they are never failed, only reported. Counted per agent process.",
            ),
            &["mode"],
        )?;
        registry.register(Box::new(checked.clone()))?;
        registry.register(Box::new(rejected.clone()))?;
        registry.register(Box::new(started_forbidden.clone()))?;
        Ok(Self {
            checked,
            rejected,
            started_forbidden,
        })
    }
}

/// The kernel to gate the safe list by: the flag, else the host's; unknown only drops the
/// gated entries, as in kubelet.
fn kernel(args: &SysctlArgs) -> Option<KernelVersion> {
    match &args.kernel_version {
        Some(k) => Some(k.clone()),
        None => KernelVersion::from_host()
            .inspect_err(|e| tracing::warn!(error = %e, "kernel version unknown; kernel-gated safe sysctls are not allowed"))
            .ok(),
    }
}

struct Admitter {
    ctx: Context,
    client: kube::Client,
    policies_api: Api<SysctlPolicy>,
    pod_store: Store<Pod>,
    policy_store: Store<SysctlPolicy>,
    node_store: Store<Node>,
    safe: Vec<&'static str>,
    flag: Vec<String>,
    default_mode: Mode,
    policy: Option<NodePolicy>,
    memory: Memory,
    retry: HashSet<ObjectRef<Pod>>,
    status_due: HashMap<String, Instant>,
    status_offset: Duration,
    metrics: Metrics,
    /// This task's own watches; other tasks' readiness must not hold admission back.
    ready: [ReadyFlag; 3],
}

pub async fn run(ctx: Context, args: SysctlArgs) -> anyhow::Result<()> {
    let kernel = kernel(&args);
    let safe = safe_sysctls(kernel.as_ref());
    tracing::info!(kernel = ?kernel.as_ref().map(ToString::to_string), safe = ?safe, allowed_unsafe = ?args.allowed_unsafe_sysctls(), default_mode = %args.sysctl_default_mode, "sysctl admission starting");
    let metrics = Metrics::register(&ctx.base.registry)?;
    let client = ctx.base.client.clone();
    let node = ctx.node_name.clone();

    // Lists are served from the apiserver's watch cache (resourceVersion=0, `any_semantic`):
    // with a field selector, a paginated quorum list would page through every pod and node in
    // the cluster from etcd, on every node, at start and after every watch desync.
    let config = || watcher::Config::default().any_semantic();
    let ready_pods = ctx.base.readiness.register("sysctl/pods");
    let ready_policies = ctx.base.readiness.register("sysctl/sysctlpolicies");
    let ready_node = ctx.base.readiness.register("sysctl/nodes");
    // plumbing's watch into a store: short capped backoff, relist after errors, health in the
    // flags.
    let (pod_store, pod_events) = watch_store(
        Api::<Pod>::all(client.clone()),
        config().fields(&format!("spec.nodeName={node}")),
        ready_pods.clone(),
    );
    let (policy_store, policy_events) = watch_store(
        Api::<SysctlPolicy>::all(client.clone()),
        config(),
        ready_policies.clone(),
    );
    let (node_store, node_events) = watch_store(
        Api::<Node>::all(client.clone()),
        config().fields(&format!("metadata.name={node}")),
        ready_node.clone(),
    );

    let status_offset = Duration::from_millis(
        node.bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))
            % STATUS_SPREAD_MS,
    );
    let mut a = Admitter {
        client: client.clone(),
        policies_api: Api::all(client),
        ctx: ctx.clone(),
        pod_store,
        policy_store,
        node_store,
        safe,
        flag: args.allowed_unsafe_sysctls(),
        default_mode: args.sysctl_default_mode,
        policy: None,
        memory: Memory::default(),
        retry: HashSet::new(),
        status_due: HashMap::new(),
        status_offset,
        metrics,
        ready: [
            ready_pods.clone(),
            ready_policies.clone(),
            ready_node.clone(),
        ],
    };

    tokio::pin!(pod_events, policy_events, node_events);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ctx.base.token.cancelled() => break,
            Some(ev) = pod_events.next() => match ev {
                Ok(watcher::Event::InitDone) => {
                    ready_pods.mark_ready();
                    a.forget_gone();
                    a.evaluate_all().await
                }
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => a.evaluate(&p).await,
                Ok(watcher::Event::Delete(p)) => a.memory.forget(&p.uid().unwrap_or_default()),
                Ok(watcher::Event::Init) => {}
                Err(e) => tracing::warn!(error = %e, node = %node, "pod watch failed; retrying"),
            },
            Some(ev) = policy_events.next() => match ev {
                Ok(watcher::Event::InitDone) => { ready_policies.mark_ready(); a.policies_changed().await }
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    a.schedule_status(&p);
                    if ready_policies.is_ready() { a.policies_changed().await }
                }
                Ok(watcher::Event::Delete(_)) => a.policies_changed().await,
                Ok(watcher::Event::Init) => {}
                Err(e) => tracing::warn!(error = %e, "SysctlPolicy watch failed (is the CRD installed?); retrying"),
            },
            Some(ev) = node_events.next() => match ev {
                Ok(watcher::Event::InitDone) => { ready_node.mark_ready(); a.policies_changed().await }
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => a.policies_changed().await,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, node = %node, "node watch failed; retrying"),
            },
            _ = tick.tick() => a.on_tick().await,
        }
    }
    tracing::info!(decisions = a.memory.len(), "sysctl admission stopped");
    Ok(())
}

impl Admitter {
    /// Recomputes the node's policy once every watch has listed and the Node is known; pods are
    /// re-evaluated when it changed. Without the Node's labels nothing is decided, since a
    /// policy selecting this node could allow what would otherwise be rejected.
    async fn policies_changed(&mut self) {
        if !self.ready.iter().all(ReadyFlag::is_ready) {
            return;
        }
        let Some(node) = self.node_store.state().into_iter().next() else {
            tracing::warn!(node = %self.ctx.node_name, "Node object not found; not admitting until it exists");
            self.policy = None;
            return;
        };
        let labels: BTreeMap<String, String> = node.labels().clone();
        let policies = self.policy_store.state();
        let refs: Vec<&SysctlPolicy> = policies.iter().map(|p| p.as_ref()).collect();
        let merged = merge(&self.safe, &self.flag, self.default_mode, &refs, &labels);
        if self.policy.as_ref() != Some(&merged) {
            tracing::info!(node = %self.ctx.node_name, mode = %merged.mode, policies = ?merged.policies, patterns = ?merged.patterns, "sysctl policy for this node");
            self.policy = Some(merged);
            self.evaluate_all().await;
        }
    }

    /// A relist drops pods deleted while the watch was down without a Delete event.
    fn forget_gone(&mut self) {
        let live: HashSet<String> = self
            .pod_store
            .state()
            .iter()
            .filter_map(|p| p.uid())
            .collect();
        self.memory.retain(|uid| live.contains(uid));
    }

    async fn evaluate_all(&mut self) {
        for pod in self.pod_store.state() {
            self.evaluate(&pod).await;
        }
    }

    async fn evaluate(&mut self, pod: &Pod) {
        let Some(policy) = self.policy.as_ref() else {
            return;
        };
        let (revision, chosen) = (policy.revision, policy.chosen);
        let facts = PodFacts::of(pod);
        let out = outcome(&policy.allowlist, policy.mode, pod);
        let action = decide(&facts, out.clone(), &self.memory, chosen);
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        match action {
            Action::Skip | Action::AlreadyDone | Action::LeaveStarted => return,
            Action::Admit => {
                tracing::debug!(pod = %name, namespace = %ns, "sysctls allowed");
            }
            // Counted once the write is done: a refused fail patch (409: the pod moved on,
            // perhaps started) is not a rejection.
            Action::Reject { mode, message } => {
                // Failing a pod is destructive: not on a policy, Node or pod list that may be
                // stale (a watch failing or relisting). Retried each tick until they are current.
                if mode == Mode::Enforce && !self.ready.iter().all(ReadyFlag::is_healthy) {
                    tracing::info!(pod = %name, namespace = %ns, "not failing pod while a sysctl watch is failing or relisting; will retry");
                    self.retry.insert(ObjectRef::from_obj(pod));
                    return;
                }
                if let Err(e) = self.reject(pod, mode, &message, revision).await {
                    match &e {
                        kube::Error::Api(s) if s.code == 409 => {
                            tracing::info!(pod = %name, namespace = %ns, "pod changed since it was judged (kubelet may have started it); judging it again")
                        }
                        _ => {
                            tracing::warn!(pod = %name, namespace = %ns, error = %e, "rejecting pod failed; will retry")
                        }
                    }
                    self.retry.insert(ObjectRef::from_obj(pod));
                    return;
                }
                self.metrics
                    .rejected
                    .with_label_values(&[FORBIDDEN_REASON, &mode.to_string()])
                    .inc();
            }
            Action::ReportStarted { mode, message } => {
                if let Err(e) = self.report_started(pod, mode, &message, revision).await {
                    tracing::warn!(pod = %name, namespace = %ns, error = %e, "reporting started pod failed; will retry");
                    self.retry.insert(ObjectRef::from_obj(pod));
                    return;
                }
                self.metrics
                    .started_forbidden
                    .with_label_values(&[&mode.to_string()])
                    .inc();
            }
        }
        self.metrics.checked.inc();
        self.retry.remove(&ObjectRef::from_obj(pod));
        self.memory.remember(&facts, out);
    }

    async fn reject(
        &self,
        pod: &Pod,
        mode: Mode,
        message: &str,
        revision: u64,
    ) -> Result<(), kube::Error> {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let verb = match mode {
            Mode::Enforce => "failing pod",
            Mode::Audit => "warning about pod (audit mode)",
        };
        if self.ctx.base.dry_run {
            tracing::info!(pod = %name, namespace = %ns, reason = FORBIDDEN_REASON, rejection = message, mode = %mode, dry_run = true, "would be {verb}");
            return Ok(());
        }
        tracing::info!(pod = %name, namespace = %ns, reason = FORBIDDEN_REASON, rejection = message, mode = %mode, "{verb}");
        if mode == Mode::Enforce {
            // Conditional on the version judged not started (see `fail_patch`): if kubelet has
            // written the pod's status since, the apiserver answers 409 and nothing is written;
            // the pod is judged again from the newer version, where it has started.
            let Some(patch) = fail_patch(pod, message) else {
                // Never seen from the apiserver without one; without it the patch would be
                // unconditional, so the pod is left alone.
                tracing::warn!(pod = %name, namespace = %ns, "pod has no resourceVersion; not failing it");
                return Ok(());
            };
            Api::<Pod>::namespaced(self.client.clone(), &ns)
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        let action = match mode {
            Mode::Enforce => "Reject",
            Mode::Audit => "Audit",
        };
        self.publish_once(pod, action, message, revision).await
    }

    /// A started pod the policy forbids: never written to; one Warning event per pod UID and
    /// policy revision, which an agent restart does not repeat.
    async fn report_started(
        &self,
        pod: &Pod,
        mode: Mode,
        message: &str,
        revision: u64,
    ) -> Result<(), kube::Error> {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let note = format!(
            "{message} (pod already started: not failed; {mode} applies to pods not yet started)"
        );
        if self.ctx.base.dry_run {
            tracing::info!(pod = %name, namespace = %ns, rejection = message, mode = %mode, dry_run = true, "would be reporting started pod with forbidden sysctls");
            return Ok(());
        }
        tracing::info!(pod = %name, namespace = %ns, rejection = message, mode = %mode, "started pod has forbidden sysctls; it is not failed, only reported");
        self.publish_once(pod, "Audit", &note, revision).await
    }

    /// Creates the pod's report event under its derived name (`report_event_name`); an
    /// existing one (409) means it was already reported, by this process or an earlier one.
    async fn publish_once(
        &self,
        pod: &Pod,
        action: &str,
        note: &str,
        revision: u64,
    ) -> Result<(), kube::Error> {
        let ns = pod.namespace().unwrap_or_default();
        let uid = pod.uid().unwrap_or_default();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(report_event_name(&pod.name_any(), &uid, revision, note)),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(jiff::Timestamp::now())),
            type_: Some("Warning".into()),
            reason: Some(FORBIDDEN_REASON.into()),
            action: Some(action.into()),
            note: Some(note.to_string()),
            regarding: Some(pod.object_ref(&())),
            reporting_controller: Some(MANAGER.into()),
            reporting_instance: Some(self.ctx.node_name.clone()),
            ..Default::default()
        };
        match Api::<Event>::namespaced(self.client.clone(), &ns)
            .create(&PostParams::default(), &event)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(pod = %pod.name_any(), namespace = %ns, "already reported under this policy revision");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn schedule_status(&mut self, policy: &SysctlPolicy) {
        if desired_status(policy, Time(jiff::Timestamp::now())).is_some() {
            self.status_due
                .entry(policy.name_any())
                .or_insert_with(|| Instant::now() + self.status_offset);
        }
    }

    async fn on_tick(&mut self) {
        let retry: Vec<ObjectRef<Pod>> = self.retry.drain().collect();
        for r in retry {
            if let Some(p) = self.pod_store.get(&r) {
                self.evaluate(&p).await;
            }
        }
        let now = Instant::now();
        let due: Vec<String> = self
            .status_due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            self.status_due.remove(&name);
            if let Err(e) = self.write_status(&name).await {
                tracing::warn!(policy = %name, error = %e, "writing SysctlPolicy status failed; will retry");
                self.status_due.insert(name, now + Duration::from_secs(5));
            }
        }
    }

    /// Server-side apply of the status under one field manager shared by all agents: they all
    /// compute the same content from the spec, so whichever writes first settles it and the
    /// rest find nothing to do (re-checked here, after the spread delay).
    async fn write_status(&self, name: &str) -> Result<(), kube::Error> {
        let Some(policy) = self.policy_store.get(&ObjectRef::new(name)) else {
            return Ok(());
        };
        let Some(status) = desired_status(&policy, Time(jiff::Timestamp::now())) else {
            return Ok(());
        };
        let condition = &status.conditions[0];
        if self.ctx.base.dry_run {
            tracing::info!(policy = %name, valid = %condition.status, reason = %condition.reason, detail = %condition.message, dry_run = true, "would write SysctlPolicy status");
            return Ok(());
        }
        tracing::info!(policy = %name, valid = %condition.status, reason = %condition.reason, detail = %condition.message, "writing SysctlPolicy status");
        let body = json!({
            "apiVersion": "groundskeeper.dev/v1alpha1",
            "kind": "SysctlPolicy",
            "metadata": {"name": name},
            "status": status,
        });
        self.policies_api
            .patch_status(
                name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(|_| ())
    }
}

/// The status patch that fails a pod, kubelet's `rejectPod` content. It carries the
/// resourceVersion of the pod it was judged on: a merge patch's `metadata.resourceVersion` is a
/// precondition, so if anything (kubelet starting the pod) wrote the pod since, the apiserver
/// refuses the patch with 409 Conflict instead of failing a pod that has started. None without
/// a resourceVersion: an unconditional patch is never sent.
pub fn fail_patch(pod: &Pod, message: &str) -> Option<serde_json::Value> {
    let rv = pod.resource_version().filter(|rv| !rv.is_empty())?;
    Some(json!({
        "metadata": {"resourceVersion": rv},
        "status": {
            "phase": "Failed",
            "reason": FORBIDDEN_REASON,
            "message": format!("{STATUS_MESSAGE_PREFIX}{message}"),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_patch_is_always_conditional() {
        let mut pod = Pod::default();
        assert_eq!(fail_patch(&pod, "m"), None, "no resourceVersion: no patch");
        pod.metadata.resource_version = Some(String::new());
        assert_eq!(
            fail_patch(&pod, "m"),
            None,
            "empty resourceVersion: no patch"
        );
        pod.metadata.resource_version = Some("42".into());
        let p = fail_patch(&pod, "forbidden sysctl: x").unwrap();
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert_eq!(p["status"]["phase"], "Failed");
        assert_eq!(p["status"]["reason"], "SysctlForbidden");
        assert_eq!(
            p["status"]["message"],
            "Pod was rejected: forbidden sysctl: x"
        );
    }
}
