//! The least-privilege rules in `controllers/rbac.yaml` (which the chart grants, see
//! testkit/tests/chart_rbac.rs) are enough: controller-manager, acting as a ServiceAccount
//! bound to exactly those rules, leads, lists, finalizes a ServiceCIDR, applies its status,
//! removes the finalizer on deletion, force-deletes an orphaned pod, watches Namespaces and
//! records an Event for a malformed PodGC policy annotation, with no "forbidden".

use std::{path::PathBuf, time::Duration};

use k8s_openapi::api::{
    core::v1::Pod,
    networking::v1::{ServiceCIDR, ServiceCIDRSpec},
};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta},
};
use testkit::{Binary, free_addr, http_get, metric, unique_name, wait_for};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_listed_rules_are_enough() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("the_listed_rules_are_enough").await else {
        return Ok(());
    };
    let ns = c.namespace("rbac").await?;
    let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rbac.yaml");
    let kubeconfig = c.as_service_account(&ns, &rules).await?;
    let admin = free_addr();
    let lease = unique_name("gk-rbac");
    let manager = Binary::start(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-rbac",
        &[
            "--admin-addr",
            &admin.to_string(),
            "--leader-elect-namespace",
            &ns,
            "--leader-elect-lease-name",
            &lease,
            // Keep this test's reach to its own objects: no threshold pass.
            "--terminated-pod-gc-threshold=0",
            "--orphan-quarantine=1s",
            "--gc-period=500ms",
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    )?;
    wait_for(
        WAIT,
        "readyz and leadership as the ServiceAccount",
        || async {
            Ok(http_get(admin, "/readyz").await?.0 == 200
                && metric(admin, "groundskeeper_leader_election_is_leader").await? == Some(1.0))
        },
    )
    .await?;

    // ServiceCIDR: finalizer (patch), Ready (status apply), then finalizer removal.
    let name = unique_name("gk-rbac");
    let x = std::process::id() % 200 + 20;
    c.create(&ServiceCIDR {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: Some(ServiceCIDRSpec {
            cidrs: Some(vec![format!("10.202.{x}.0/24")]),
        }),
        status: None,
    })
    .await?;
    let cidrs: Api<ServiceCIDR> = Api::all(c.client.clone());
    wait_for(WAIT, "finalizer and Ready=True", || async {
        let s = cidrs.get(&name).await?;
        let finalized = s
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == "networking.k8s.io/service-cidr-finalizer");
        let ready = s
            .status
            .and_then(|st| st.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        Ok(finalized && ready)
    })
    .await?;
    cidrs.delete(&name, &DeleteParams::default()).await?;
    wait_for(
        WAIT,
        "the ServiceCIDR gone after its grace period",
        || async { Ok(cidrs.get_opt(&name).await?.is_none()) },
    )
    .await?;

    // PodGC: an orphan (node never existed) is marked Failed and force-deleted.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let orphan = unique_name("orphan");
    c.create(&testkit::bound_pod(&ns, &orphan, &unique_name("gone-node")))
        .await?;
    wait_for(WAIT, "the orphaned pod deleted", || async {
        Ok(pods.get_opt(&orphan).await?.is_none())
    })
    .await?;

    // PodGC policy: a malformed annotation on this test's namespace becomes an Event.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.client.clone());
    namespaces
        .patch(
            &ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                "groundskeeper.dev/terminated-pod-ttl": "someday"}}})),
        )
        .await?;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(c.client.clone(), "default");
    wait_for(WAIT, "the policy Event on the namespace", || async {
        Ok(events
            .list(&Default::default())
            .await?
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("InvalidPodGCPolicy")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&*ns)
            }))
    })
    .await?;

    manager.assert_no_api_refusals();
    Ok(())
}
