//! Admission's writes to the API, behind a trait, with `--dry-run` decided in one place.
//!
//! The writes (fail a pod's status, post a pod's report Event, apply a policy's status) are
//! behind [`Writes`] (the kube one here, a recording fake in the tests); [`Writer`] carries out
//! what admission decided and is the one place `--dry-run` is decided. The one read admission
//! makes outside its watches goes with them: the fresh view of the policies and the Node it
//! takes right before failing a pod ([`Writes::read_fresh`]).

use std::future::Future;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, ObjectMeta};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::allowlist::FORBIDDEN_REASON;
use super::cache::Labels;
use super::crd::{Mode, SysctlPolicy, SysctlPolicyStatus};
use super::decide::report_event_name;
use crate::context::MANAGER;

/// kubelet's `rejectPod` prefix on the pod status message (the event carries the bare message).
pub const STATUS_MESSAGE_PREFIX: &str = "Pod was rejected: ";

/// The API writes admission makes, nothing decided here.
pub trait Writes: Send + Sync {
    /// Merge-patches a pod's status with `patch` (a [`fail_patch`]).
    fn fail_pod(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Creates `event`; an existing one of the same name is the apiserver's 409.
    fn create_event(&self, event: &Event) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Server-side applies a SysctlPolicy's status, forced, under [`MANAGER`].
    fn apply_policy_status(
        &self,
        name: &str,
        status: &SysctlPolicyStatus,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Every SysctlPolicy and the labels of Node `node` (`None`: no such Node), read from the
    /// apiserver now, not from the watches: lists without a resourceVersion, which the
    /// apiserver answers with what etcd holds now (a quorum read).
    fn read_fresh(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<(Vec<SysctlPolicy>, Option<Labels>), kube::Error>> + Send;
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
    async fn fail_pod(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
    }

    async fn create_event(&self, event: &Event) -> Result<(), kube::Error> {
        let ns = event.metadata.namespace.as_deref().unwrap_or_default();
        Api::<Event>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), event)
            .await
            .map(|_| ())
    }

    /// A list of the one Node by name rather than a GET: the agent may list nodes, not get them.
    async fn read_fresh(
        &self,
        node: &str,
    ) -> Result<(Vec<SysctlPolicy>, Option<Labels>), kube::Error> {
        let policies = Api::<SysctlPolicy>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let labels = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("metadata.name={node}")))
            .await?
            .items
            .into_iter()
            .next()
            .map(|n| n.metadata.labels.unwrap_or_default());
        Ok((policies, labels))
    }

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

/// What is about to be written, for the log line that goes with it.
enum Intent<'a> {
    /// A pod using forbidden sysctls: failed (Enforce, not started), warned about (Audit, not
    /// started) or only reported (started).
    Forbidden {
        pod: &'a Pod,
        mode: Mode,
        message: &'a str,
        started: bool,
    },
    Status {
        policy: &'a str,
        condition: &'a Condition,
    },
}

/// Carries out admission's decisions through `W`; under `--dry-run` only logs them.
pub struct Writer<W> {
    writes: W,
    dry_run: bool,
    /// The reporting instance of the events.
    node_name: String,
}

impl<W: Writes> Writer<W> {
    pub fn new(writes: W, dry_run: bool, node_name: String) -> Self {
        Self {
            writes,
            dry_run,
            node_name,
        }
    }

    /// The one place `--dry-run` is decided: logs the write about to be made, or under
    /// `--dry-run` the one that would be, and says whether to make it.
    fn proceed(&self, intent: Intent<'_>) -> bool {
        let would = if self.dry_run { "dry-run: would " } else { "" };
        match intent {
            Intent::Forbidden {
                pod,
                mode,
                message,
                started,
            } => {
                let verb = match (started, mode, self.dry_run) {
                    (false, Mode::Enforce, false) => "failing pod",
                    (false, Mode::Enforce, true) => "fail pod",
                    (false, Mode::Audit, false) => "warning about pod (audit mode)",
                    (false, Mode::Audit, true) => "warn about pod (audit mode)",
                    (true, _, false) => {
                        "started pod has forbidden sysctls; it is not failed, only reported"
                    }
                    (true, _, true) => "report started pod with forbidden sysctls",
                };
                tracing::info!(pod = %pod.name_any(), namespace = %pod.namespace().unwrap_or_default(), reason = FORBIDDEN_REASON, rejection = message, mode = %mode, "{would}{verb}");
            }
            Intent::Status { policy, condition } => {
                let verb = if self.dry_run {
                    "write SysctlPolicy status"
                } else {
                    "writing SysctlPolicy status"
                };
                tracing::info!(policy = %policy, valid = %condition.status, reason = %condition.reason, detail = %condition.message, "{would}{verb}");
            }
        }
        !self.dry_run
    }

    /// A pod using forbidden sysctls. Not started: in Enforce its status is failed
    /// (conditional on the version judged, see [`fail_patch`]) and a `Reject` event posted, in
    /// Audit only an `Audit` event. Started (kubelet admitted it): never written to, only an
    /// `Audit` event saying so. One event per pod UID, policy revision and note, which an agent
    /// restart does not repeat.
    pub async fn forbidden(
        &self,
        pod: &Pod,
        mode: Mode,
        message: &str,
        started: bool,
        revision: u64,
    ) -> Result<(), kube::Error> {
        if !self.proceed(Intent::Forbidden {
            pod,
            mode,
            message,
            started,
        }) {
            return Ok(());
        }
        if started {
            let note = format!(
                "{message} (pod already started: not failed; {mode} applies to pods not yet started)"
            );
            return self.publish_once(pod, "Audit", &note, revision).await;
        }
        if mode == Mode::Audit {
            return self.publish_once(pod, "Audit", message, revision).await;
        }
        // If kubelet has written the pod's status since it was judged, the apiserver answers
        // 409 and nothing is written; the pod is judged again from the newer version, where it
        // has started.
        let Some(patch) = fail_patch(pod, message) else {
            // Never seen from the apiserver without one; without it the patch would be
            // unconditional, so the pod is left alone.
            tracing::warn!(pod = %pod.name_any(), namespace = %pod.namespace().unwrap_or_default(), "pod has no resourceVersion; not failing it");
            return Ok(());
        };
        let ns = pod.namespace().unwrap_or_default();
        self.writes.fail_pod(&ns, &pod.name_any(), &patch).await?;
        self.publish_once(pod, "Reject", message, revision).await
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

    /// The fresh view of the policies and this node's labels (a read: made in dry-run too).
    pub async fn read_fresh(&self) -> Result<(Vec<SysctlPolicy>, Option<Labels>), kube::Error> {
        self.writes.read_fresh(&self.node_name).await
    }

    /// A Warning Event on `pod` saying a write about it keeps being refused (once per note).
    pub async fn warn_pod(&self, pod: &Pod, note: &str, revision: u64) -> Result<(), kube::Error> {
        if self.dry_run {
            return Ok(());
        }
        self.publish_once(pod, "WriteRefused", note, revision).await
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
            reporting_instance: Some(self.node_name.clone()),
            ..Default::default()
        };
        match self.writes.create_event(&event).await {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(pod = %pod.name_any(), namespace = %ns, "already reported under this policy revision");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
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
