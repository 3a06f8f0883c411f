//! Admission's state machine: driven by watch changes and a tick, it acts through `apply`.
//!
//! It keeps the node's merged policy, what was done per pod (`decide::Memory`), the pods whose
//! writes are retried, and the policy status writes coming due, and carries out what `decide`
//! says through `apply::Writer`: fail a pod that has not started and warn in Enforce, warn in
//! Audit, only report a started pod, and keep each policy's status current.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use groundskeeper_plumbing::cache::Shared;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use tokio::time::Instant;

use super::allowlist::FORBIDDEN_REASON;
use super::apply::{Writer, Writes};
use super::cache::{Cache, Change, Health, PodKey};
use super::crd::{Mode, SysctlPolicy};
use super::decide::{Action, Memory, Outcome, PodFacts, decide, outcome};
use super::metrics::Metrics;
use super::policy::{NodePolicy, desired_status, merge};

/// How often failed writes are retried and delayed status writes come due.
pub const TICK: Duration = Duration::from_secs(1);
/// Status writes are spread over this window by node name, so that of many agents seeing the
/// same policy change, the first write is seen by most before their own turn comes.
const STATUS_SPREAD_MS: u64 = 5_000;
/// A failed status write is tried again after this long.
const STATUS_RETRY: Duration = Duration::from_secs(5);
/// A pod write the apiserver keeps refusing (a 403 from an admission policy, a webhook) is
/// tried again at the next tick, then after 2 s, 4 s, ... up to this.
pub const POD_RETRY_MAX: Duration = Duration::from_secs(300);

/// When a pod's write is tried again, and how many times in a row the apiserver refused it.
#[derive(Clone, Copy, Debug)]
struct Retry {
    due: Instant,
    refused: u32,
}

/// The wait before the next attempt after `refused` refusals in a row: the next tick, then
/// doubling from 2 s up to [`POD_RETRY_MAX`]. (Waiting for stale watches or re-judging after a
/// 409 is not a refusal: every tick.)
pub fn pod_retry_delay(refused: u32) -> Duration {
    match refused {
        0 | 1 => Duration::ZERO,
        n => TICK
            .saturating_mul(1u32.checked_shl(n - 1).unwrap_or(u32::MAX))
            .min(POD_RETRY_MAX),
    }
}

/// How long this node waits before writing a policy's status: the same for a node every time,
/// spread over [`STATUS_SPREAD_MS`] across nodes.
pub fn status_offset(node: &str) -> Duration {
    Duration::from_millis(
        node.bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))
            % STATUS_SPREAD_MS,
    )
}

/// What admission is configured with, fixed for the process.
pub struct Settings {
    pub node_name: String,
    /// The safe sysctls the kernel namespaces.
    pub safe: Vec<&'static str>,
    /// `--allowed-unsafe-sysctls`.
    pub flag: Vec<String>,
    /// `--sysctl-default-mode`.
    pub default_mode: Mode,
}

pub struct Admission<W> {
    settings: Settings,
    cache: Shared<Cache>,
    /// This task's own watches; other tasks' readiness must not hold admission back.
    watches: Health,
    writer: Writer<W>,
    metrics: Metrics,
    policy: Option<NodePolicy>,
    memory: Memory,
    retry: HashMap<PodKey, Retry>,
    status_due: HashMap<String, Instant>,
    status_offset: Duration,
}

impl<W: Writes> Admission<W> {
    pub fn new(
        settings: Settings,
        cache: Shared<Cache>,
        watches: Health,
        writer: Writer<W>,
        metrics: Metrics,
    ) -> Self {
        let status_offset = status_offset(&settings.node_name);
        Self {
            settings,
            cache,
            watches,
            writer,
            metrics,
            policy: None,
            memory: Memory::default(),
            retry: HashMap::new(),
            status_due: HashMap::new(),
            status_offset,
        }
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
                if self.watches.policies.is_ready() {
                    self.policies_changed().await
                }
            }
            Change::Merge => self.policies_changed().await,
        }
    }

    /// Retries the pods whose writes failed (those that came due) and writes the statuses
    /// that came due.
    pub async fn on_tick(&mut self) {
        let now = Instant::now();
        let due: Vec<PodKey> = self
            .retry
            .iter()
            .filter(|(_, r)| r.due <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            let pod = self.cache.lock().pods.get(&key).cloned();
            match pod {
                Some(pod) => self.evaluate(&pod).await,
                None => {
                    self.retry.remove(&key);
                }
            }
        }
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
                self.status_due.insert(name, now + STATUS_RETRY);
            }
        }
    }

    /// Recomputes the node's policy once every watch has listed and the Node is known; pods are
    /// re-evaluated when it changed. Without the Node's labels nothing is decided, since a
    /// policy selecting this node could allow what would otherwise be rejected.
    async fn policies_changed(&mut self) {
        if !self.watches.listed() {
            return;
        }
        let merged = {
            let cache = self.cache.lock();
            let Some(labels) = cache.nodes.values().next() else {
                drop(cache);
                tracing::warn!(node = %self.settings.node_name, "Node object not found; not admitting until it exists");
                self.policy = None;
                return;
            };
            let policies: Vec<&SysctlPolicy> = cache.policies.values().collect();
            let s = &self.settings;
            merge(&s.safe, &s.flag, s.default_mode, &policies, labels)
        };
        if self.policy.as_ref() != Some(&merged) {
            tracing::info!(node = %self.settings.node_name, mode = %merged.mode, policies = ?merged.policies, patterns = ?merged.patterns, "sysctl policy for this node");
            self.policy = Some(merged);
            self.evaluate_all().await;
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
        let (revision, chosen) = (policy.revision, policy.chosen);
        let facts = PodFacts::of(pod);
        let out = outcome(&policy.allowlist, policy.mode, pod);
        let action = decide(&facts, out.clone(), &self.memory, chosen);
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let started = matches!(action, Action::ReportStarted { .. });
        match action {
            Action::Skip | Action::AlreadyDone | Action::LeaveStarted => {
                // Nothing (more) to write: whatever was to be retried is over.
                self.retry.remove(&PodKey::of(pod));
                return;
            }
            Action::Admit => {
                tracing::debug!(pod = %name, namespace = %ns, "sysctls allowed");
            }
            // Counted once the write is done: a refused fail patch (409: the pod moved on,
            // perhaps started) is not a rejection.
            Action::Reject { mode, message } | Action::ReportStarted { mode, message } => {
                let key = PodKey::of(pod);
                // Refused before: not again before its backoff ends, whatever brings the pod
                // back (an update, a policy change).
                let refused = self.retry.get(&key).map_or(0, |r| r.refused);
                if refused > 0 && self.retry.get(&key).is_some_and(|r| r.due > Instant::now()) {
                    return;
                }
                // Failing a pod is destructive: not on a policy, Node or pod list that may be
                // stale (a watch failing or relisting). Retried each tick until they are current.
                if !started && mode == Mode::Enforce && !self.watches.healthy() {
                    tracing::info!(pod = %name, namespace = %ns, "not failing pod while a sysctl watch is failing or relisting; will retry");
                    self.retry_next_tick(key, refused);
                    return;
                }
                // The three watches arrive separately: a policy change or a relabel made before
                // the pod may not have arrived yet. Failing only on a fresh read that agrees.
                if !started && mode == Mode::Enforce {
                    match self.confirmed(pod).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::info!(pod = %name, namespace = %ns, "not failing pod: the policies and Node read fresh do not forbid it (the watches are behind); judging it again");
                            self.retry_next_tick(key, refused);
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(pod = %name, namespace = %ns, error = %e, "not failing pod: reading the policies and Node fresh failed; will retry");
                            self.retry_next_tick(key, refused);
                            return;
                        }
                    }
                }
                let written = self
                    .writer
                    .forbidden(pod, mode, &message, started, revision)
                    .await;
                if let Err(e) = written {
                    if let kube::Error::Api(s) = &e
                        && s.code == 409
                        && !started
                    {
                        tracing::info!(pod = %name, namespace = %ns, "pod changed since it was judged (kubelet may have started it); judging it again");
                        self.retry_next_tick(key, refused);
                        return;
                    }
                    self.refused(pod, &e, refused + 1, revision).await;
                    return;
                }
                let mode = mode.to_string();
                if started {
                    self.metrics
                        .started_forbidden
                        .with_label_values(&[&mode])
                        .inc();
                } else {
                    self.metrics
                        .rejected
                        .with_label_values(&[FORBIDDEN_REASON, &mode])
                        .inc();
                }
            }
        }
        self.metrics.checked.inc();
        self.retry.remove(&PodKey::of(pod));
        self.memory.remember(&facts, out);
    }

    /// Whether the policies and the Node read fresh from the apiserver fail `pod` in Enforce
    /// too (a Node that is gone fails nothing: nothing is decided without its labels).
    async fn confirmed(&self, pod: &Pod) -> Result<bool, kube::Error> {
        let (policies, labels) = self.writer.read_fresh().await?;
        let Some(labels) = labels else {
            return Ok(false);
        };
        let s = &self.settings;
        let policies: Vec<&SysctlPolicy> = policies.iter().collect();
        let fresh = merge(&s.safe, &s.flag, s.default_mode, &policies, &labels);
        Ok(matches!(
            outcome(&fresh.allowlist, fresh.mode, pod),
            Outcome::Reject {
                mode: Mode::Enforce,
                ..
            }
        ))
    }

    fn retry_next_tick(&mut self, key: PodKey, refused: u32) {
        let due = Instant::now();
        self.retry.insert(key, Retry { due, refused });
    }

    /// A write about `pod` failed for the `refused`th time in a row: counted by HTTP code,
    /// retried after [`pod_retry_delay`], and once the retry was refused too (not a blip) said
    /// on the pod in an Event: an operator looking at a pod that should have been failed sees
    /// why it was not.
    async fn refused(&mut self, pod: &Pod, e: &kube::Error, refused: u32, revision: u64) {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let code = match e {
            kube::Error::Api(s) => s.code,
            _ => 0,
        };
        self.metrics
            .pod_write_failures
            .with_label_values(&[&code.to_string()])
            .inc();
        let retry_in = pod_retry_delay(refused).max(TICK);
        tracing::warn!(pod = %name, namespace = %ns, error = %e, code, refused, retry_in = ?retry_in, "writing to the pod failed; retrying with backoff");
        let due = Instant::now() + pod_retry_delay(refused);
        self.retry.insert(PodKey::of(pod), Retry { due, refused });
        if refused == 2 && code != 0 {
            let note = format!(
                "groundskeeper could not act on this pod: the apiserver answered {code} ({e}); retrying with exponential backoff, at most every {POD_RETRY_MAX:?}"
            );
            if let Err(e) = self.writer.warn_pod(pod, &note, revision).await {
                tracing::debug!(pod = %name, namespace = %ns, error = %e, "the Event about it failed too");
            }
        }
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
