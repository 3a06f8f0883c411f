//! The Pod and Node shapes PodGC reads off the wire.
//!
//! serde skips every other field while parsing (containers, volumes, managedFields but the
//! last status write's time, annotations, node images...), so a full object is never built, not
//! even briefly: that is most of the memory difference with upstream.

use std::borrow::Cow;

use k8s_openapi::{
    ClusterResourceScope, NamespaceResourceScope,
    apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time},
};
use kube::Resource;
use serde::{Deserialize, Deserializer};

/// A core/v1 object as PodGC sees it: the slim metadata, and of `spec` and `status` only the
/// fields `Spec` and `Status` declare.
#[derive(Deserialize, Clone, Debug, Default)]
pub struct WireObject<Spec, Status> {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<Spec>,
    #[serde(default)]
    pub status: Option<Status>,
}

/// A Pod as PodGC sees it.
pub type WirePod = WireObject<WirePodSpec, WirePodStatus>;

/// A Node as PodGC sees it: readiness and taint keys.
pub type WireNode = WireObject<WireNodeSpec, WireNodeStatus>;

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct WirePodSpec {
    pub node_name: Option<String>,
}

#[derive(Deserialize, Clone, Debug, Default)]
pub struct WirePodStatus {
    pub phase: Option<String>,
    pub reason: Option<String>,
    #[serde(default)]
    pub conditions: Option<Vec<WireCondition>>,
    /// Only `state.terminated.finishedAt` survives parsing: the TTL's "terminated at".
    #[serde(default, rename = "containerStatuses")]
    pub container_statuses: Option<Vec<WireContainerStatus>>,
    #[serde(default, rename = "initContainerStatuses")]
    pub init_container_statuses: Option<Vec<WireContainerStatus>>,
}

#[derive(Deserialize, Clone, Debug, Default)]
pub struct WireContainerStatus {
    #[serde(default)]
    pub state: Option<WireContainerState>,
}

#[derive(Deserialize, Clone, Debug, Default)]
pub struct WireContainerState {
    #[serde(default)]
    pub terminated: Option<WireTerminated>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct WireTerminated {
    pub finished_at: Option<Time>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct WireCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub last_transition_time: Option<Time>,
}

#[derive(Deserialize, Clone, Debug, Default)]
pub struct WireNodeSpec {
    #[serde(default)]
    pub taints: Option<Vec<WireTaint>>,
}

#[derive(Deserialize, Clone, Debug, Default)]
pub struct WireTaint {
    pub key: String,
}

#[derive(Deserialize, Clone, Debug, Default)]
pub struct WireNodeStatus {
    #[serde(default)]
    pub conditions: Option<Vec<WireCondition>>,
}

impl WireNode {
    /// `status.conditions`, empty when absent.
    pub fn conditions(&self) -> &[WireCondition] {
        let status = self.status.as_ref();
        status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
    }

    /// `spec.taints`, empty when absent.
    pub fn taints(&self) -> &[WireTaint] {
        let spec = self.spec.as_ref();
        spec.and_then(|s| s.taints.as_deref()).unwrap_or_default()
    }
}

/// The metadata fields PodGC and the watcher (resourceVersion) use.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    /// Only the latest `time` of an entry for the `status` subresource survives: when the
    /// apiserver last recorded a change to the pod's status, on the apiserver's clock.
    #[serde(
        default,
        rename = "managedFields",
        deserialize_with = "last_status_write"
    )]
    status_written: Option<Time>,
}

/// The two fields of a `managedFields` entry the last status write is read from.
#[derive(Deserialize)]
struct SlimManagedFields {
    subresource: Option<String>,
    time: Option<Time>,
}

fn last_status_write<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Time>, D::Error> {
    let entries = Option::<Vec<SlimManagedFields>>::deserialize(d)?;
    Ok(entries
        .into_iter()
        .flatten()
        .filter(|e| e.subresource.as_deref() == Some("status"))
        .filter_map(|e| e.time)
        .max_by_key(|t| t.0))
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = SlimMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        managed_fields: m.status_written.map(|t| {
            vec![ManagedFieldsEntry {
                subresource: Some("status".into()),
                time: Some(t),
                ..ManagedFieldsEntry::default()
            }]
        }),
        ..ObjectMeta::default()
    })
}

macro_rules! core_v1 {
    ($ty:ty, $kind:literal, $plural:literal, $scope:ty) => {
        impl Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                "".into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                "v1".into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

core_v1!(WirePod, "Pod", "pods", NamespaceResourceScope);
core_v1!(WireNode, "Node", "nodes", ClusterResourceScope);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_read_fields_survive_parsing() {
        let pod: WirePod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {"big": "x"}, "managedFields": [{"manager": "m"}],
                "labels": {"a": "b"}
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Failed", "reason": "Evicted",
                "conditions": [{"type": "DisruptionTarget", "status": "True",
                    "lastTransitionTime": "2026-01-01T00:00:05Z"}],
                "containerStatuses": [{"name": "c"}]}
        }))
        .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("7"));
        assert!(pod.metadata.annotations.is_none());
        assert!(pod.metadata.managed_fields.is_none());
        assert!(pod.metadata.labels.is_none());
        assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("n1"));
        let status = pod.status.unwrap();
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        assert_eq!(status.conditions.unwrap()[0].type_, "DisruptionTarget");
    }

    #[test]
    fn urls_are_core_v1() {
        assert_eq!(
            WirePod::url_path(&(), Some("ns")),
            "/api/v1/namespaces/ns/pods"
        );
        assert_eq!(WireNode::url_path(&(), None), "/api/v1/nodes");
    }
}
