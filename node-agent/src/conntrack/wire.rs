//! What the watches decode of each Service, EndpointSlice and IPAddress: the fields the model's
//! projection (`model/project.rs`) reads and the ones the watch itself needs (name, namespace,
//! labels, resourceVersion), nothing else.
//!
//! Why: the apiserver sends every object whole, with its `managedFields` (a JSON tree about as
//! large as the object, one allocation per node), annotations, and per endpoint a targetRef,
//! nodeName, zone and hints. Decoded into k8s-openapi's types, all of it is allocated and freed
//! again on every event and every listed object, only for the projection to keep a few
//! addresses. Decoded into these types, serde skips the rest without allocating: at 10k
//! Services / 100k endpoints that is most of the agent's CPU per EndpointSlice event and of the
//! garbage a list leaves in the heap.
//!
//! The projection (`model/project.rs`) reads these types as they are; `wire_tests.rs` checks
//! over generated objects that an object decoded here projects to the model the whole object
//! reads as (`model::reference::whole`), so a field the projection starts to read and this file
//! drops fails there.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServiceSpec, ServiceStatus};
use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::api::networking::v1::IPAddress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

/// The metadata a watch and the projection read; every other field of `metadata` is skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    namespace: Option<String>,
    /// kube-runtime's watcher resumes from the last object's resourceVersion.
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
}

fn meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = Option::<WireMeta>::deserialize(d)?;
    Ok(m.map(|m| ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        resource_version: m.resource_version,
        labels: m.labels,
        ..ObjectMeta::default()
    })
    .unwrap_or_default())
}

/// A Service: metadata as above; spec and status whole (small, and all of them are read).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct WireService {
    #[serde(default, deserialize_with = "meta")]
    pub metadata: ObjectMeta,
    pub spec: Option<ServiceSpec>,
    pub status: Option<ServiceStatus>,
}

/// An EndpointSlice: its address type, ports, and of each endpoint its addresses and
/// conditions.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireSlice {
    #[serde(default, deserialize_with = "meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub address_type: String,
    pub ports: Option<Vec<EndpointPort>>,
    #[serde(default, deserialize_with = "null_is_empty")]
    pub endpoints: Vec<WireEndpoint>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WireEndpoint {
    #[serde(default, deserialize_with = "null_is_empty")]
    pub addresses: Vec<String>,
    pub conditions: Option<EndpointConditions>,
}

/// An IPAddress: its name is the IP; nothing else is read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct WireIpAddress {
    #[serde(default, deserialize_with = "meta")]
    pub metadata: ObjectMeta,
}

/// A list absent or `null` reads as empty, as k8s-openapi reads it.
fn null_is_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// kube's `Resource` for a wire type, with the identity (kind, group, version, plural, scope)
/// of the k8s-openapi type it decodes.
macro_rules! resource_of {
    ($wire:ty, $full:ty) => {
        impl kube::Resource for $wire {
            type DynamicType = ();
            type Scope = <$full as k8s_openapi::Resource>::Scope;

            fn kind(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::KIND.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::VERSION.into()
            }
            fn api_version(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::API_VERSION.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
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

resource_of!(WireService, Service);
resource_of!(WireSlice, EndpointSlice);
resource_of!(WireIpAddress, IPAddress);
