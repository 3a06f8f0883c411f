//! The slim decoding's rule, over generated objects (every field the model reads, and much it
//! does not: managedFields, annotations, targetRefs, hints, odd ports and conditions): an object
//! decoded slim (`wire.rs`) projects to the same facts as the whole object, keeps what the watch
//! needs (name, namespace, resourceVersion, labels), and a world of them builds the same model.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::IPAddress;
use kube::runtime::watcher::Event;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use testkit::rng::Rng;

use super::model::{self, project, project_tests};
use super::wire::{WireIpAddress, WireService, WireSlice};

/// `full` as the apiserver sends it, decoded slim.
pub(super) fn decode<W: DeserializeOwned>(full: &impl Serialize) -> W {
    serde_json::from_value(serde_json::to_value(full).expect("serializes"))
        .expect("the slim type decodes what the whole one encodes")
}

/// A watch event of whole objects as the agent's watch decodes it.
pub(super) fn slim_event<F: Serialize, W: DeserializeOwned>(ev: Event<F>) -> Event<W> {
    match ev {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(o) => Event::InitApply(decode(&o)),
        Event::Apply(o) => Event::Apply(decode(&o)),
        Event::Delete(o) => Event::Delete(decode(&o)),
    }
}

fn same_identity(
    a: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    b: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    a.name == b.name
        && a.namespace == b.namespace
        && a.resource_version == b.resource_version
        && a.labels == b.labels
}

#[test]
fn a_slim_object_projects_as_the_whole_one() {
    let mut served = 0;
    for seed in 0..5000 {
        let rng = &mut Rng(seed);
        let svc = project_tests::service(rng, "default", "s");
        let slim = Service::from(decode::<WireService>(&svc));
        assert_eq!(
            project::service(&slim),
            project::service(&svc),
            "seed {seed}"
        );
        assert!(same_identity(&slim.metadata, &svc.metadata), "seed {seed}");

        let owner = rng.chance(80).then_some("s");
        let slice = project_tests::slice(rng, "default", "s-1", owner);
        let slim = EndpointSlice::from(decode::<WireSlice>(&slice));
        let view = project::slice(&slice);
        assert_eq!(project::slice(&slim), view, "seed {seed}");
        assert!(
            same_identity(&slim.metadata, &slice.metadata),
            "seed {seed}"
        );
        served += usize::from(!view.serving.is_empty());

        let a: IPAddress = serde_json::from_value(json!({
            "metadata": {"name": project_tests::addr(rng), "resourceVersion": "7",
                         "managedFields": [{"manager": "kube-apiserver", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"parentRef": {"group": "", "resource": "services", "namespace": "d", "name": "s"}},
        }))
        .unwrap();
        let slim = IPAddress::from(decode::<WireIpAddress>(&a));
        assert_eq!(
            project::ip_address(&slim),
            project::ip_address(&a),
            "seed {seed}"
        );
        assert!(same_identity(&slim.metadata, &a.metadata), "seed {seed}");
    }
    // The generator must produce slices with backends, or the check above proves little.
    assert!(served > 500, "only {served} of 5000 slices served");
}

#[test]
fn a_world_of_slim_objects_builds_the_model_of_whole_ones() {
    for seed in 0..1000 {
        let rng = &mut Rng(seed);
        let services: Vec<Service> = (0..1 + rng.below(5))
            .map(|i| project_tests::service(rng, "default", &format!("s{i}")))
            .collect();
        let slices: Vec<EndpointSlice> = (0..rng.below(6))
            .map(|j| {
                let owner = format!("s{}", rng.below(5));
                project_tests::slice(rng, "default", &format!("s-{j}"), Some(&owner))
            })
            .collect();
        let slim_services: Vec<Service> = services
            .iter()
            .map(|s| decode::<WireService>(s).into())
            .collect();
        let slim_slices: Vec<EndpointSlice> = slices
            .iter()
            .map(|s| decode::<WireSlice>(s).into())
            .collect();
        assert_eq!(
            model::reference::build(&slim_services, &slim_slices),
            model::reference::build(&services, &slices),
            "seed {seed}"
        );
    }
}

/// What the apiserver may send that k8s-openapi also takes: nulls and absent lists.
#[test]
fn nulls_and_absent_fields_decode_as_the_whole_type_decodes_them() {
    let bodies = [
        json!({"metadata": {"name": "a"}, "addressType": "IPv4", "endpoints": null}),
        json!({"metadata": {"name": "a"}, "addressType": "IPv4", "endpoints": [{"addresses": null}]}),
        json!({"metadata": {"name": "a", "labels": null}, "addressType": "IPv4", "ports": null,
               "endpoints": [{"addresses": ["10.0.0.1"], "conditions": null}]}),
    ];
    for b in bodies {
        let whole: Result<EndpointSlice, _> = serde_json::from_value(b.clone());
        let slim: WireSlice = serde_json::from_value(b.clone()).expect("decodes");
        if let Ok(whole) = whole {
            assert_eq!(project::slice(&slim.into()), project::slice(&whole), "{b}");
        }
    }
    // Hostile bodies are an error, not a panic.
    for b in [
        json!({"metadata": 3}),
        json!({"endpoints": [{"addresses": [1]}]}),
        json!("x"),
    ] {
        assert!(serde_json::from_value::<WireSlice>(b).is_err());
    }
}
