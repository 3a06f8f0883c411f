//! The worker's writes to the API, behind a trait, with `--dry-run` decided in one place.
//!
//! The status write is behind [`Writes`] (the kube one here, a recording fake in the tests);
//! the report Events and the Node's default pod sysctl Events go through plumbing's Event
//! writer, which decides `--dry-run` for them.
//! [`Writer`] carries out what the worker decided and is the one place `--dry-run` is decided
//! for the status. No pod is ever written: the agent reports.

use std::future::Future;

use groundskeeper_plumbing::events::{Events, Notice, Recorded, Repeat, Severity};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::allowlist::FORBIDDEN_REASON;
use super::crd::{Mode, SysctlPolicy, SysctlPolicyStatus};
use super::decide::{default_event_name, report_event_name};
use crate::context::MANAGER;

/// The Event reason of a pod that ran although the Enforce policy of its node forbade it.
pub const RAN_REASON: &str = "SysctlForbiddenRan";

/// The Event reason on the Node of a default pod sysctl the node can not apply.
pub const DEFAULT_UNAVAILABLE_REASON: &str = "DefaultPodSysctlUnavailable";

/// A write of the worker's that failed (retried on the tick).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("reporting the pod: {0}")]
    Report(#[source] kube::Error),
    #[error("writing the SysctlPolicy status: {0}")]
    Status(#[source] kube::Error),
    #[error("flagging the default pod sysctl on the Node: {0}")]
    Default(#[source] kube::Error),
}

impl WriteError {
    /// The `error` label of `groundskeeper_sysctl_write_errors_total`: what the apiserver
    /// answered.
    pub fn metric_label(&self) -> &'static str {
        match self {
            WriteError::Report(e) | WriteError::Status(e) | WriteError::Default(e) => {
                groundskeeper_plumbing::client::api_error_label(e)
            }
        }
    }
}

/// The API writes the worker makes, nothing decided here.
pub trait Writes: Send + Sync {
    /// Server-side applies a SysctlPolicy's status, forced, under [`MANAGER`].
    fn apply_policy_status(
        &self,
        name: &str,
        status: &SysctlPolicyStatus,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
}

pub struct KubeWrites {
    client: kube::Client,
}

impl KubeWrites {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Writes for KubeWrites {
    /// One field manager shared by all agents: they all compute the same content from the
    /// spec, so whichever writes first settles it and the rest find nothing to do.
    async fn apply_policy_status(
        &self,
        name: &str,
        status: &SysctlPolicyStatus,
    ) -> Result<(), kube::Error> {
        let body = json!({
            "apiVersion": "groundskeeper.dev/v1alpha1",
            "kind": "SysctlPolicy",
            "metadata": {"name": name},
            "status": status,
        });
        Api::<SysctlPolicy>::all(self.client.clone())
            .patch_status(
                name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(|_| ())
    }
}

/// What a pod with forbidden sysctls is reported as; each is one Event, never a pod write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// Started while the node's Enforce verdict forbade it: the policy did not keep it off.
    Ran,
    /// Started while the node's Audit verdict forbade it.
    Audit,
    /// Started before the verdict that forbids it now, under `mode`.
    StartedBefore(Mode),
}

/// What is about to be written, for the log line that goes with it.
enum Intent<'a> {
    /// A started pod using forbidden sysctls, reported.
    Forbidden {
        pod: &'a Pod,
        report: Report,
        message: &'a str,
    },
    Status {
        policy: &'a str,
        condition: &'a Condition,
    },
}

/// Carries out the worker's decisions through `W`; under `--dry-run` only logs them.
pub struct Writer<W> {
    writes: W,
    dry_run: bool,
    /// The report Events, from this node.
    events: Events,
}

impl<W: Writes> Writer<W> {
    pub fn new(writes: W, dry_run: bool, events: Events) -> Self {
        Self {
            writes,
            dry_run,
            events,
        }
    }

    /// The one place `--dry-run` is decided for the status: logs the write about to be made,
    /// or under `--dry-run` the one that would be, and says whether to make it.
    fn proceed(&self, intent: Intent<'_>) -> bool {
        Self::log(intent, self.dry_run);
        !self.dry_run
    }

    /// The log line of a write, worded as made or (`dry_run`) as it would be.
    fn log(intent: Intent<'_>, dry_run: bool) {
        let would = if dry_run { "dry-run: would " } else { "" };
        match intent {
            Intent::Forbidden {
                pod,
                report,
                message,
            } => {
                let (verb, mode) = match (report, dry_run) {
                    (Report::Ran, false) => (
                        "reporting pod that ran despite the Enforce sysctl policy (not stopped)",
                        Mode::Enforce,
                    ),
                    (Report::Ran, true) => (
                        "report pod that ran despite the Enforce sysctl policy",
                        Mode::Enforce,
                    ),
                    (Report::Audit, false) => (
                        "reporting pod with forbidden sysctls (audit mode)",
                        Mode::Audit,
                    ),
                    (Report::Audit, true) => (
                        "report pod with forbidden sysctls (audit mode)",
                        Mode::Audit,
                    ),
                    (Report::StartedBefore(m), false) => (
                        "reporting pod started before the policy that forbids its sysctls (not stopped)",
                        m,
                    ),
                    (Report::StartedBefore(m), true) => (
                        "report pod started before the policy that forbids its sysctls",
                        m,
                    ),
                };
                tracing::info!(pod = %pod.name_any(), namespace = %pod.namespace().unwrap_or_default(), forbidden = message, mode = %mode, "{would}{verb}");
            }
            Intent::Status { policy, condition } => {
                let verb = if dry_run {
                    "write SysctlPolicy status"
                } else {
                    "writing SysctlPolicy status"
                };
                tracing::info!(policy = %policy, valid = %condition.status, reason = %condition.reason, detail = %condition.message, "{would}{verb}");
            }
        }
    }

    /// Reports a started pod using forbidden sysctls: one Warning Event per pod UID, policy
    /// revision and note, which an agent restart does not repeat. The pod is not written.
    pub async fn report(
        &self,
        pod: &Pod,
        report: Report,
        message: &str,
        revision: u64,
    ) -> Result<(), kube::Error> {
        // Worded by the Event writer's dry-run, which decides whether the report is written.
        Self::log(
            Intent::Forbidden {
                pod,
                report,
                message,
            },
            self.events.dry_run(),
        );
        let (reason, action, note) = match report {
            Report::Ran => (
                RAN_REASON,
                "Ran",
                format!(
                    "{message}: started on this node although its Enforce sysctl policy forbids it \
                     (the admission webhook did not keep it off); not stopped"
                ),
            ),
            Report::Audit => (FORBIDDEN_REASON, "Audit", message.to_string()),
            Report::StartedBefore(mode) => (
                FORBIDDEN_REASON,
                "Audit",
                format!(
                    "{message} (already started when this agent came to judge it under the {mode} \
                     policy that forbids it: not stopped)"
                ),
            ),
        };
        self.publish_once(pod, reason, action, &note, message, revision)
            .await
    }

    /// Flags on `node` a default pod sysctl it can not apply: one Warning Event per default and
    /// note (which says why), which an agent restart does not repeat. No pod is written.
    pub async fn flag_default(
        &self,
        node: &str,
        sysctl: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let notice = Notice {
            severity: Severity::Warning,
            reason: DEFAULT_UNAVAILABLE_REASON.into(),
            action: "Check".into(),
            note: note.to_string(),
            // Node Events go in `default`, as kubelet's do.
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.into()),
                ..ObjectReference::default()
            },
            repeat: Repeat::Once(default_event_name(node, sysctl, note)),
        };
        if self.events.publish(&notice).await? == Recorded::AlreadyThere {
            tracing::debug!(sysctl, "default pod sysctl already flagged on the Node");
        }
        Ok(())
    }

    /// Writes a policy's status (computed by `policy::desired_status`).
    pub async fn write_status(
        &self,
        policy: &str,
        status: &SysctlPolicyStatus,
    ) -> Result<(), kube::Error> {
        let condition = &status.conditions[0];
        if !self.proceed(Intent::Status { policy, condition }) {
            return Ok(());
        }
        self.writes.apply_policy_status(policy, status).await
    }

    /// Creates the pod's report event under its derived name (`report_event_name` of the
    /// verdict's message); an existing one (409) means it was already reported, by this
    /// process or an earlier one.
    async fn publish_once(
        &self,
        pod: &Pod,
        reason: &str,
        action: &str,
        note: &str,
        message: &str,
        revision: u64,
    ) -> Result<(), kube::Error> {
        let ns = pod.namespace().unwrap_or_default();
        let uid = pod.uid().unwrap_or_default();
        let notice = Notice {
            severity: Severity::Warning,
            reason: reason.into(),
            action: action.into(),
            note: note.to_string(),
            regarding: pod.object_ref(&()),
            // Named by the verdict's message, not the note: whichever report a pod got under
            // this revision (ran, audited, started before), a second is not made, even by
            // a restarted agent that can no longer tell when the pod started.
            repeat: Repeat::Once(report_event_name(&pod.name_any(), &uid, revision, message)),
        };
        if self.events.publish_logged(&notice).await? == Recorded::AlreadyThere {
            tracing::debug!(pod = %pod.name_any(), namespace = %ns, "already reported under this policy revision");
        }
        Ok(())
    }
}
