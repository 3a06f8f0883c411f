//! The ServiceCIDR finalizer removal against a real apiserver, when it lands late: a deposed
//! leader's write that passed the fence while its term was valid and was then held on the wire
//! (a partition, here a frozen proxy) until after the object changed. The removal carries the
//! resourceVersion it was judged on, so the apiserver answers 409 and the finalizer stays.

use std::time::Duration;

use groundskeeper_controllers::{
    leader::Fence,
    servicecidr::apply::{KubeWrites, Writes},
};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::json;
use testkit::{Cluster, networking::service_cidr, proxy::Proxy, unique_name};

const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";

/// A ServiceCIDR held by our finalizer and being deleted, as the controller would judge it
/// once the grace is over: its name and the object judged.
async fn deleting_cidr(c: &Cluster, cidr: &str) -> anyhow::Result<ServiceCIDR> {
    let name = unique_name("late-write");
    let mut o = service_cidr(&name, [cidr]);
    o.metadata.finalizers = Some(vec![FINALIZER.into()]);
    c.create(&o).await?;
    let api = Api::<ServiceCIDR>::all(c.client.clone());
    api.delete(&name, &DeleteParams::default()).await?;
    let judged = api.get(&name).await?;
    assert!(judged.metadata.deletion_timestamp.is_some());
    Ok(judged)
}

/// What the new leader writes meanwhile: the Ready condition, as after finding a blocker.
async fn change_meanwhile(api: &Api<ServiceCIDR>, name: &str) -> anyhow::Result<String> {
    let body = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "status": {"conditions": [{
            "type": "Ready", "status": "False", "reason": "Terminating",
            "message": "changed after the old leader judged it",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]}
    });
    let params = PatchParams::apply("new-leader").force();
    let changed = api.patch_status(name, &params, &Patch::Apply(body)).await?;
    Ok(changed.resource_version().unwrap_or_default())
}

#[tokio::test]
async fn a_late_finalizer_removal_on_a_changed_object_fails_and_the_finalizer_stays()
-> anyhow::Result<()> {
    let test = "a_late_finalizer_removal_on_a_changed_object_fails_and_the_finalizer_stays";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let Some(apiserver) = testkit::proxy::apiserver_addr(&c.kubeconfig)? else {
        testkit::skipped(
            test,
            "the apiserver is named by host name: no proxy in front",
        );
        return Ok(());
    };
    let api = Api::<ServiceCIDR>::all(c.client.clone());
    let judged = deleting_cidr(&c, "10.231.7.0/24").await?;
    let name = judged.name_any();
    let judged_rv = judged.resource_version().expect("a stored object has one");

    // The old leader's writer, on a link that is about to freeze. The connection is made
    // first, so the request itself is what the partition holds.
    let proxy = Proxy::start(apiserver).await?;
    let via = testkit::proxy::kubeconfig_with_server(&c.kubeconfig, &proxy.url())?;
    let old_client = testkit::client_for(&via).await?;
    Api::<ServiceCIDR>::all(old_client.clone())
        .get(&name)
        .await?;
    let old = KubeWrites::new(old_client, Fence::unbounded());
    proxy.freeze();
    let late = tokio::spawn({
        let (name, rv) = (name.clone(), judged_rv.clone());
        async move { old.remove_finalizer(&name, &rv).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!late.is_finished(), "the write waits behind the partition");

    let changed_rv = change_meanwhile(&api, &name).await?;
    assert_ne!(changed_rv, judged_rv);
    proxy.resume();
    let answer = tokio::time::timeout(Duration::from_secs(30), late).await??;
    match answer {
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        other => panic!("the late removal must fail with 409 Conflict, got {other:?}"),
    }
    let now = api.get(&name).await?;
    assert!(
        now.finalizers().iter().any(|f| f == FINALIZER),
        "the finalizer stays: {:?}",
        now.finalizers()
    );
    assert_eq!(
        now.resource_version(),
        Some(changed_rv.clone()),
        "nothing else was written"
    );

    // ReportedKubelet again on the current version, the same write goes through: the 409 came from the
    // version, not from the write.
    KubeWrites::new(c.client.clone(), Fence::unbounded())
        .remove_finalizer(&name, &changed_rv)
        .await?;
    testkit::wait_for(Duration::from_secs(10), "the ServiceCIDR to go", || async {
        Ok(api.get_opt(&name).await?.is_none())
    })
    .await?;
    Ok(())
}
