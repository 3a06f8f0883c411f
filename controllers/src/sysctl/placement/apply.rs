//! The placement's writes, and the one place `--dry-run` is decided for them: the pod update
//! that sets the required node affinity and takes the gate off (one write, conditional on the
//! resourceVersion the decision was made on), and the pod condition and Event of a pod that no
//! node admits.

use std::future::Future;

use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::events::{Events, Notice, Repeat, Severity};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{NodeSelector, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::leader::{Fence, Fenced};
use crate::sysctl::facts::{CONDITION, GATE, GatedPod};

/// The target of this file's log lines, which `RUST_LOG` filters select by: named after
/// the component (`sysctlplacement`), wherever its code sits.
const LOG_TARGET: &str = "groundskeeper_controllers::sysctlplacement::apply";

/// The field manager of the placement's writes.
pub const FIELD_MANAGER: &str = "groundskeeper-sysctl-placement";
/// The Event's reason for a pod that no node admits (and the condition's).
pub const REASON_HELD: &str = "NoNodeAdmitsSysctls";
/// The condition's reason once the pod is placed.
pub const REASON_PLACED: &str = "Placed";

/// The API writes, nothing decided here.
pub trait Writes: Send + Sync + 'static {
    /// A JSON merge patch of the pod (see [`placement_patch`]).
    fn patch_pod(
        &self,
        key: &ObjectKey,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// A strategic merge patch of the pod's status (see [`condition_patch`]).
    fn patch_status(
        &self,
        key: &ObjectKey,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
}

/// The writes made through the Lease fence: only while this replica leads.
pub struct KubeWrites {
    client: kube::Client,
    fence: Fence,
}

impl KubeWrites {
    pub fn new(client: kube::Client, fence: Fence) -> Self {
        Self { client, fence }
    }
}

fn fenced(r: Result<Result<Pod, kube::Error>, Fenced>) -> Result<(), kube::Error> {
    match r {
        Ok(r) => r.map(drop),
        Err(f) => Err(kube::Error::Service(Box::new(f))),
    }
}

impl Writes for KubeWrites {
    async fn patch_pod(
        &self,
        key: &ObjectKey,
        patch: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        let api = Api::<Pod>::namespaced(self.client.clone(), key.namespace());
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        fenced(
            self.fence
                .guard(api.patch(key.name(), &params, &Patch::Merge(patch)))
                .await,
        )
    }

    async fn patch_status(
        &self,
        key: &ObjectKey,
        patch: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        let api = Api::<Pod>::namespaced(self.client.clone(), key.namespace());
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        fenced(
            self.fence
                .guard(api.patch_status(key.name(), &params, &Patch::Strategic(patch)))
                .await,
        )
    }
}

/// The merge patch that places `pod`: `required` as its required node affinity (None: left as
/// it is), every gate but ours, and the resourceVersion the decision was made on as the
/// precondition (a pod changed since answers 409 and is judged again from the watch).
pub fn placement_patch(pod: &GatedPod, required: Option<&NodeSelector>) -> serde_json::Value {
    let gates: Vec<serde_json::Value> = pod
        .gates
        .iter()
        .filter(|g| *g != GATE)
        .map(|g| json!({"name": g}))
        .collect();
    let mut spec = json!({
        // A merge patch replaces lists whole; null removes the field.
        "schedulingGates": if gates.is_empty() { serde_json::Value::Null } else { json!(gates) },
    });
    if let Some(required) = required {
        spec["affinity"] = json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": required,
        }});
    }
    json!({
        "metadata": {"resourceVersion": pod.resource_version},
        "spec": spec,
    })
}

/// The pod condition [`CONDITION`]: `False` with the reason no node admits the pod, `True`
/// once placed.
pub fn condition_patch(held: Option<&str>, now: Timestamp) -> serde_json::Value {
    let (status, reason, message) = match held {
        Some(m) => ("False", REASON_HELD, m.to_string()),
        None => (
            "True",
            REASON_PLACED,
            "placed on the nodes that admit its sysctls".to_string(),
        ),
    };
    json!({"status": {"conditions": [{
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": Time(now),
    }]}})
}

/// The writes as the controller makes them: through `W`, or only logged under `--dry-run`.
pub struct Apply<W> {
    writes: W,
    dry_run: bool,
    events: Events,
}

impl<W: Writes> Apply<W> {
    pub fn new(writes: W, dry_run: bool, events: Events) -> Self {
        Self {
            writes,
            dry_run,
            events,
        }
    }

    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Sets `required` (None: no change) and takes the gate off; a pod that was held gets its
    /// condition turned `True`. Under `--dry-run` only logs: the pod stays gated.
    pub async fn place(
        &self,
        key: &ObjectKey,
        pod: &GatedPod,
        required: Option<&NodeSelector>,
        what: &str,
    ) -> Result<(), kube::Error> {
        let patch = placement_patch(pod, required);
        if self.dry_run {
            tracing::info!(target: LOG_TARGET, pod = %key, affinity = %patch["spec"]["affinity"], "dry-run: would {what} and remove scheduling gate {GATE}");
            return Ok(());
        }
        self.writes.patch_pod(key, &patch).await?;
        tracing::info!(target: LOG_TARGET, pod = %key, "{what}; removed scheduling gate {GATE}");
        if pod.held.is_some()
            && let Err(e) = self
                .writes
                .patch_status(key, &condition_patch(None, Timestamp::now()))
                .await
        {
            // The pod is placed; a stale condition misleads but blocks nothing.
            tracing::warn!(target: LOG_TARGET, pod = %key, error = %e, "could not mark the placement condition True");
        }
        Ok(())
    }

    /// Keeps the pod gated and says why: the condition and a Warning Event (a new one only
    /// when the reason changed: the caller compares with the pod's condition).
    pub async fn hold(
        &self,
        key: &ObjectKey,
        pod: &GatedPod,
        reason: &str,
    ) -> Result<(), kube::Error> {
        let name = key.to_string();
        tracing::info!(target: LOG_TARGET, pod = %name, reason, "no node admits the pod's sysctls: it stays gated");
        let notice = Notice {
            severity: Severity::Warning,
            reason: REASON_HELD.into(),
            action: "Place".into(),
            note: reason.into(),
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(key.namespace().to_string()),
                name: Some(key.name().to_string()),
                uid: Some(pod.uid.clone()),
                ..Default::default()
            },
            repeat: Repeat::SeriesPerNote,
        };
        if let Err(e) = self.events.publish(&notice).await {
            tracing::warn!(target: LOG_TARGET, pod = %name, error = %e, "could not record the placement Event");
        }
        if self.dry_run {
            tracing::info!(target: LOG_TARGET, pod = %name, "dry-run: would set condition {CONDITION}=False");
            return Ok(());
        }
        self.writes
            .patch_status(key, &condition_patch(Some(reason), Timestamp::now()))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use groundskeeper_plumbing::events::Reporter;

    #[derive(Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<(&'static str, serde_json::Value)>>>);

    impl Writes for Recorded {
        async fn patch_pod(&self, _: &ObjectKey, p: &serde_json::Value) -> Result<(), kube::Error> {
            self.0.lock().unwrap().push(("pod", p.clone()));
            Ok(())
        }
        async fn patch_status(
            &self,
            _: &ObjectKey,
            p: &serde_json::Value,
        ) -> Result<(), kube::Error> {
            self.0.lock().unwrap().push(("status", p.clone()));
            Ok(())
        }
    }

    fn gated(gates: &[&str], held: Option<&str>) -> GatedPod {
        GatedPod {
            uid: "u".into(),
            resource_version: "42".into(),
            gates: gates.iter().map(|g| g.to_string()).collect(),
            held: held.map(String::from),
            ..Default::default()
        }
    }

    fn events() -> Events {
        let sink = Arc::new(groundskeeper_plumbing::events::Recording::default());
        Events::to(sink, Reporter::on("sysctl-placement", "test"), false)
    }

    #[test]
    fn the_patch_keeps_other_gates_and_is_conditional() {
        let required: NodeSelector = serde_json::from_value(json!({"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}))
        .unwrap();
        let p = placement_patch(&gated(&["x/y", GATE], None), Some(&required));
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert_eq!(p["spec"]["schedulingGates"], json!([{"name": "x/y"}]));
        assert_eq!(
            p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0]["values"],
            json!(["b"])
        );
        assert!(
            p["spec"]["affinity"]["nodeAffinity"]
                .get("preferredDuringSchedulingIgnoredDuringExecution")
                .is_none(),
            "preferred affinity is not touched"
        );
        let p = placement_patch(&gated(&[GATE], None), None);
        assert_eq!(p["spec"]["schedulingGates"], serde_json::Value::Null);
        assert!(
            p["spec"].get("affinity").is_none(),
            "anywhere: the spec is left alone"
        );
    }

    #[tokio::test]
    async fn dry_run_writes_nothing() {
        let rec = Recorded::default();
        let a = Apply::new(rec.clone(), true, events());
        a.place(
            &ObjectKey::new("ns", "p"),
            &gated(&[GATE], Some("m")),
            None,
            "place",
        )
        .await
        .unwrap();
        a.hold(&ObjectKey::new("ns", "p"), &gated(&[GATE], None), "why")
            .await
            .unwrap();
        assert!(rec.0.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_held_pod_placed_later_gets_its_condition_turned_true() {
        let rec = Recorded::default();
        let a = Apply::new(rec.clone(), false, events());
        let key = ObjectKey::new("ns", "p");
        a.hold(&key, &gated(&[GATE], None), "no node admits x")
            .await
            .unwrap();
        a.place(
            &key,
            &gated(&[GATE], Some("no node admits x")),
            None,
            "place",
        )
        .await
        .unwrap();
        a.place(&key, &gated(&[GATE], None), None, "place")
            .await
            .unwrap();
        let calls = rec.0.lock().unwrap().clone();
        let kinds: Vec<&str> = calls.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, ["status", "pod", "status", "pod"]);
        assert_eq!(calls[0].1["status"]["conditions"][0]["status"], "False");
        assert_eq!(
            calls[0].1["status"]["conditions"][0]["message"],
            "no node admits x"
        );
        assert_eq!(calls[2].1["status"]["conditions"][0]["status"], "True");
    }
}
