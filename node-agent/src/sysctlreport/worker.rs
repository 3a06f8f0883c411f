//! The reports' worker, a state machine: driven by watch changes and a tick, it acts through
//! `apply`.
//!
//! It keeps the node's merged policy and since when it is in force, what was done per pod
//! (`decide::Memory`), the pods whose reports are retried, and the policy status writes coming
//! due, and carries out what `decide` says through `apply::Writer`: report a started pod that
//! the node's policy forbids (ran despite Enforce, audited, or started before the policy), and
//! keep each policy's status current. Once it knows the Node's kubelet version it judges the
//! node's default pod sysctls, and flags on the Node each one the node can not apply, once per
//! change of its judgement. It writes no pod.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::{logging::klog::KObj, watch::cache::Shared};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use tokio::time::Instant;

use groundskeeper_sysctl_rules::defaults::{self, DefaultPodSysctls, Effect, State};
use groundskeeper_sysctl_rules::kubelet::Kubelet;
use groundskeeper_sysctl_rules::verdict::Verdict;

use super::apply::{Report, WriteError, Writer, Writes};
use super::cache::{Change, Flags, ReportCache};
use super::crd::{Mode, SysctlPolicy};
use super::decide::{Action, Memory, PodFacts, decide, default_note};
use super::kernel::KernelVersion;
use super::metrics::Metrics;
use super::policy::{NodePolicy, desired_status, merge_in};
use groundskeeper_plumbing::watch::cache::Health;

/// How often failed writes are retried and delayed status writes come due.
pub const TICK: Duration = Duration::from_secs(1);
/// Status writes are spread over this window by node name, so that of many agents seeing the
/// same policy change, the first write is seen by most before their own turn comes.
const STATUS_SPREAD_MS: u64 = 5_000;
/// A failed status write is tried again after this long.
const STATUS_RETRY: Duration = Duration::from_secs(5);

/// How long this node waits before writing a policy's status: the same for a node every time,
/// spread over `STATUS_SPREAD_MS` across nodes.
pub fn status_offset(node: &str) -> Duration {
    Duration::from_millis(
        node.bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))
            % STATUS_SPREAD_MS,
    )
}

/// What the worker is configured with, fixed for the process.
pub struct Settings {
    pub node_name: String,
    /// The host's kernel (None: unknown, so only the ungated safe sysctls); which safe sysctls
    /// it gets also depends on the Node's kubelet version, read from the Node.
    pub kernel: Option<KernelVersion>,
    /// `--allowed-unsafe-sysctls`.
    pub flag: Vec<String>,
    /// `--sysctl-default-mode`.
    pub default_mode: Mode,
    /// `--default-pod-sysctls`: kubelet's `defaultPodSysctls` on this node.
    pub defaults: DefaultPodSysctls,
}

pub struct Worker<W> {
    settings: Settings,
    cache: Shared<ReportCache>,
    /// This task's own watches; other tasks' readiness must not hold the worker back.
    watches: Health,
    /// The SysctlPolicy watch alone.
    policies: Health,
    writer: Writer<W>,
    metrics: Metrics,
    policy: Option<NodePolicy>,
    /// The kubelet rules `policy` was merged by, and why they are not the Node's own version's
    /// (logged when it changes).
    kubelet: Option<(Kubelet, Option<String>)>,
    /// When `policy` came into force here: pods kubelet started later started under it.
    policy_since: jiff::Timestamp,
    memory: Memory,
    retry: HashSet<ObjectKey>,
    status_due: HashMap<String, Instant>,
    status_offset: Duration,
    /// Each default pod sysctl's last judgement, by name.
    defaults: HashMap<String, Effect>,
    /// The defaults judged unavailable whose Event is not written yet (retried on the tick).
    unflagged: BTreeSet<String>,
}

impl<W: Writes> Worker<W> {
    pub fn new(
        settings: Settings,
        cache: Shared<ReportCache>,
        flags: Flags,
        writer: Writer<W>,
        metrics: Metrics,
    ) -> Self {
        let status_offset = status_offset(&settings.node_name);
        Self {
            settings,
            cache,
            watches: flags.health(),
            policies: flags.policies(),
            writer,
            metrics,
            policy: None,
            kubelet: None,
            policy_since: jiff::Timestamp::now(),
            memory: Memory::default(),
            retry: HashSet::new(),
            status_due: HashMap::new(),
            status_offset,
            defaults: HashMap::new(),
            unflagged: BTreeSet::new(),
        }
    }

    /// Reacts to each of `changes` and to every [`TICK`] until `stop` (the shutdown token).
    pub async fn run(
        mut self,
        changes: impl futures::Stream<Item = Change>,
        stop: impl std::future::Future<Output = ()>,
    ) {
        use futures::StreamExt;
        let mut changes = std::pin::pin!(changes);
        let mut stop = std::pin::pin!(stop);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                Some(change) = changes.next() => self.on_change(change).await,
                _ = tick.tick() => self.on_tick().await,
            }
        }
        tracing::info!(decisions = self.decisions(), "sysctl admission stopped");
    }

    /// How many pods have a remembered outcome.
    pub fn decisions(&self) -> usize {
        self.memory.len()
    }

    /// Reacts to a change the cache has already applied.
    pub async fn on_change(&mut self, change: Change) {
        match change {
            Change::None => {}
            Change::Pod(pod) => self.evaluate(&pod).await,
            Change::PodGone(uid) => self.memory.forget(&uid),
            Change::PodsListed => {
                self.forget_gone();
                if self.policy.is_none() {
                    // The pods can be the last of the three watches to list, and no Node or
                    // policy event may follow for a long time: merge now (that judges every pod).
                    self.policies_changed().await
                } else {
                    self.evaluate_all().await
                }
            }
            Change::Policy(policy) => {
                self.schedule_status(&policy);
                if self.policies.listed() {
                    self.policies_changed().await
                }
            }
            Change::Merge => self.policies_changed().await,
        }
    }

    /// Retries the pods whose writes failed and the Node's Events not written yet, and writes
    /// the statuses that came due.
    pub async fn on_tick(&mut self) {
        if !self.unflagged.is_empty() {
            self.flag_defaults().await;
        }
        let retry: Vec<ObjectKey> = self.retry.drain().collect();
        for key in retry {
            let pod = self.cache.lock().pods.get(&key).cloned();
            if let Some(pod) = pod {
                self.evaluate(&pod).await;
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
                let e = WriteError::Status(e);
                self.failed(&e);
                tracing::warn!(policy = %name, error = %e, "writing SysctlPolicy status failed; will retry");
                self.status_due.insert(name, now + STATUS_RETRY);
            }
        }
    }

    /// Recomputes the node's policy once every watch has listed and the Node is known; pods are
    /// re-evaluated when it changed. Without the Node's labels nothing is decided, since a
    /// policy selecting this node could allow what would otherwise be forbidden. The rules are
    /// the Node's own kubelet version's (`status.nodeInfo.kubeletVersion`).
    async fn policies_changed(&mut self) {
        if !self.watches.listed() {
            return;
        }
        let (merged, judged) = {
            let cache = self.cache.lock();
            let Some(node) = cache.nodes.values().next() else {
                drop(cache);
                tracing::warn!(
                    node = KObj::cluster(&self.settings.node_name).field(),
                    "Node object not found; not admitting until it exists"
                );
                self.policy = None;
                return;
            };
            let policies: Vec<&SysctlPolicy> = cache.policies.values().collect();
            let s = &self.settings;
            let judged = Kubelet::from_reported(node.kubelet.as_deref());
            let k = judged.kubelet;
            let safe = k.safe_sysctls(s.kernel.as_ref());
            let merged = merge_in(
                k.namespaces(),
                &safe,
                &s.flag,
                s.default_mode,
                &policies,
                &node.labels,
            );
            (merged, judged)
        };
        let rules = (judged.kubelet, judged.assumed);
        if self.kubelet.as_ref() != Some(&rules) {
            let (kubelet, assumed) = &rules;
            match assumed {
                Some(why) => {
                    tracing::warn!(node = KObj::cluster(&self.settings.node_name).field(), kubelet = %kubelet, reason = %why, "judging sysctls by another kubelet version's rules")
                }
                None => {
                    tracing::info!(node = KObj::cluster(&self.settings.node_name).field(), kubelet = %kubelet, "judging sysctls by this node's kubelet version")
                }
            }
            for (sysctl, why) in kubelet.dropped(self.settings.kernel.as_ref()) {
                tracing::info!(sysctl, reason = %why, "dropping the sysctl from the safe sysctl list");
            }
            self.kubelet = Some(rules);
        }
        self.report_defaults(judged.kubelet).await;
        if self.policy.as_ref() != Some(&merged) {
            tracing::info!(node = KObj::cluster(&self.settings.node_name).field(), mode = %merged.mode, policies = %groundskeeper_plumbing::logging::telemetry::joined(&merged.policies), patterns = %groundskeeper_plumbing::logging::telemetry::joined(&merged.patterns), "sysctl policy for this node");
            self.policy = Some(merged);
            self.policy_since = jiff::Timestamp::now();
            self.evaluate_all().await;
        }
    }

    /// Judges the node's default pod sysctls by `kubelet`'s rules and this kernel. A default
    /// whose judgement changed is logged and its gauge set; one the node can not apply is
    /// flagged on the Node.
    async fn report_defaults(&mut self, kubelet: Kubelet) {
        let s = &self.settings;
        let changed: Vec<(String, Effect)> =
            defaults::effects(&s.defaults, kubelet, s.kernel.as_ref())
                .into_iter()
                .filter(|(d, j)| self.defaults.get(&d.name) != Some(j))
                .map(|(d, j)| (d.name.clone(), j))
                .collect();
        for (name, j) in changed {
            let state = j.state();
            for st in State::ALL {
                self.metrics
                    .default_pod_sysctls
                    .with_label_values(&[name.as_str(), st.as_str()])
                    .set(i64::from(st == state));
            }
            let node = &self.settings.node_name;
            match state {
                State::Applied => {
                    tracing::info!(node = KObj::cluster(node).field(), sysctl = %name, kubelet = %kubelet, judgement = %j, "default pod sysctl");
                    self.unflagged.remove(&name);
                }
                State::Ignored => {
                    tracing::warn!(node = KObj::cluster(node).field(), sysctl = %name, kubelet = %kubelet, judgement = %j, "default pod sysctl not applied by this node's kubelet");
                    self.unflagged.remove(&name);
                }
                State::Unavailable => {
                    tracing::warn!(node = KObj::cluster(node).field(), sysctl = %name, kubelet = %kubelet, judgement = %j, "default pod sysctl can not be applied on this node");
                    self.unflagged.insert(name.clone());
                }
            }
            self.defaults.insert(name, j);
        }
        if !self.unflagged.is_empty() {
            self.flag_defaults().await;
        }
    }

    /// Writes the Node's Event for each default judged unavailable and not flagged yet; a
    /// failed write stays for the tick.
    async fn flag_defaults(&mut self) {
        let names: Vec<String> = self.unflagged.iter().cloned().collect();
        for name in names {
            let Some(j) = self.defaults.get(&name) else {
                self.unflagged.remove(&name);
                continue;
            };
            let note = default_note(&name, j);
            match self
                .writer
                .flag_default(&self.settings.node_name, &name, &note)
                .await
            {
                Ok(()) => {
                    self.unflagged.remove(&name);
                }
                Err(e) => {
                    let e = WriteError::Default(e);
                    self.failed(&e);
                    tracing::warn!(sysctl = %name, error = %e, "flagging the default pod sysctl on the Node failed; will retry");
                }
            }
        }
    }

    /// A relist drops pods deleted while the watch was down without a Delete event.
    fn forget_gone(&mut self) {
        let live: HashSet<String> = self
            .cache
            .lock()
            .pods
            .values()
            .filter_map(|p| p.uid())
            .collect();
        self.memory.retain(|uid| live.contains(uid));
    }

    async fn evaluate_all(&mut self) {
        let pods: Vec<Pod> = self.cache.lock().pods.values().cloned().collect();
        for pod in pods {
            self.evaluate(&pod).await;
        }
    }

    async fn evaluate(&mut self, pod: &Pod) {
        let Some(policy) = self.policy.as_ref() else {
            return;
        };
        let (revision, chosen, since) = (policy.revision, policy.chosen, self.policy_since);
        let facts = PodFacts::of(pod);
        let verdict = policy.verdict(pod.spec.as_ref());
        let action = decide(&facts, verdict.clone(), &self.memory, chosen, since);
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let (report, message) = match action {
            Action::Skip | Action::AlreadyDone | Action::LeaveStarted => return,
            Action::Admit => {
                tracing::debug!(pod = %name, namespace = %ns, "sysctls allowed");
                self.done(pod, &facts, verdict);
                return;
            }
            Action::Await { mode, message } => {
                if mode == Mode::Enforce {
                    // Honest about what happened: the agent stops nothing. kubelet decides now.
                    tracing::info!(pod = %name, namespace = %ns, forbidden = %message, "pod bound to this node although its Enforce sysctl policy forbids it (the admission webhook did not keep it off); waiting for kubelet's verdict, the agent does not fail pods");
                } else {
                    tracing::debug!(pod = %name, namespace = %ns, forbidden = %message, "forbidden pod not started yet (audit mode)");
                }
                self.done(pod, &facts, verdict);
                return;
            }
            Action::ReportRan { message } => (Report::Ran, message),
            Action::ReportAudit { message } => (Report::Audit, message),
            Action::ReportStarted { mode, message } => (Report::StartedBefore(mode), message),
        };
        if let Err(e) = self.writer.report(pod, report, &message, revision).await {
            let e = WriteError::Report(e);
            self.failed(&e);
            tracing::warn!(pod = %name, namespace = %ns, error = %e, "reporting pod failed; will retry");
            self.retry.insert(ObjectKey::of(pod));
            return;
        }
        match report {
            Report::Ran => self
                .metrics
                .ran_forbidden
                .with_label_values(&["Enforce"])
                .inc(),
            Report::Audit => self
                .metrics
                .ran_forbidden
                .with_label_values(&["Audit"])
                .inc(),
            Report::StartedBefore(mode) => self
                .metrics
                .started_forbidden
                .with_label_values(&[&mode.to_string()])
                .inc(),
        }
        self.done(pod, &facts, verdict);
    }

    /// The pod was handled under `verdict`: counted, no longer retried, remembered.
    fn done(&mut self, pod: &Pod, facts: &PodFacts, verdict: Verdict) {
        self.metrics.checked.inc();
        self.retry.remove(&ObjectKey::of(pod));
        self.memory.remember(facts, verdict);
    }

    fn schedule_status(&mut self, policy: &SysctlPolicy) {
        if desired_status(policy, Time(jiff::Timestamp::now())).is_some() {
            self.status_due
                .entry(policy.name_any())
                .or_insert_with(|| Instant::now() + self.status_offset);
        }
    }

    /// The status is checked again when it comes due, after the spread delay: another agent
    /// may have written it meanwhile, and then there is nothing to do.
    fn failed(&self, e: &WriteError) {
        self.metrics
            .write_errors
            .with_label_values(&[e.metric_label()])
            .inc();
    }

    async fn write_status(&self, name: &str) -> Result<(), kube::Error> {
        let policy = self.cache.lock().policies.get(&name.to_string()).cloned();
        let Some(policy) = policy else {
            return Ok(());
        };
        let Some(status) = desired_status(&policy, Time(jiff::Timestamp::now())) else {
            return Ok(());
        };
        self.writer.write_status(name, &status).await
    }
}
