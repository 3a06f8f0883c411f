//! The slim decoding's rule, over generated objects (every field the model reads, and much it
//! does not: managedFields, annotations, targetRefs, hints, odd ports and conditions): an object
//! decoded slim (`wire.rs`) keeps what the watch needs (name, namespace, resourceVersion,
//! labels), and its facts build the model the whole object reads as (`reference::whole`), alone
//! and in a world of them.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::IPAddress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use testkit::rng::Rng;

use super::model::reference::{self, slim, whole};
use super::model::{Model, project, project_tests};
use super::wire::{WireIpAddress, WireService, WireSlice};

fn same_identity(a: &ObjectMeta, b: &ObjectMeta) -> bool {
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
        let slim_svc: WireService = slim(&svc);
        assert!(
            same_identity(&slim_svc.metadata, &svc.metadata),
            "seed {seed}"
        );

        let owner = rng.chance(80).then_some("s");
        let slice = project_tests::slice(rng, "default", "s-1", owner);
        let slim_slice: WireSlice = slim(&slice);
        assert!(
            same_identity(&slim_slice.metadata, &slice.metadata),
            "seed {seed}"
        );
        let (svc_facts, slice_facts) = (project::service(&slim_svc), project::slice(&slim_slice));
        served += usize::from(!slice_facts.serving.is_empty());
        assert_eq!(
            reference::build_facts([("default", "s", &svc_facts)], [("default", &slice_facts)]),
            whole::build([&svc], [&slice]),
            "seed {seed}"
        );

        let a: IPAddress = serde_json::from_value(json!({
            "metadata": {"name": project_tests::addr(rng), "resourceVersion": "7",
                         "managedFields": [{"manager": "kube-apiserver", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"parentRef": {"group": "", "resource": "services", "namespace": "d", "name": "s"}},
        }))
        .unwrap();
        let slim_a: WireIpAddress = slim(&a);
        assert_eq!(
            Model::default().with_service_ranges([], project::ip_address(&slim_a)),
            whole::with_service_ips(Model::default(), [], [&a]),
            "seed {seed}"
        );
        assert!(same_identity(&slim_a.metadata, &a.metadata), "seed {seed}");
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
        // `reference::build` decodes each object slim, as the watch does, and projects it.
        assert_eq!(
            reference::build(&services, &slices),
            whole::build(&services, &slices),
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
        let wire: WireSlice = serde_json::from_value(b.clone()).expect("decodes");
        if let Ok(whole) = whole {
            let decoded: WireSlice = reference::slim(&whole);
            assert_eq!(project::slice(&wire), project::slice(&decoded), "{b}");
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
