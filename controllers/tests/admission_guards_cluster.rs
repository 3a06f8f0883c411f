//! The chart's admission policies against a real apiserver, as the users they stop: a namespace
//! user with the `edit` role can not take groundskeeper's scheduling gate off a pod (and every
//! other update of theirs goes through), and the controller-manager's own credentials change
//! only what its controllers write: the caBundles of its webhook configurations, and in a pod's
//! status its phase to Failed and its two conditions. The apiserver evaluates these policies
//! itself, so no replica runs here: they hold with every replica down.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Binding, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;
use testkit::Cluster;

const GATE: &str = "groundskeeper.dev/sysctl";

/// A client that acts as `user` (impersonation, as `kubectl --as`).
async fn as_user(c: &Cluster, user: &str) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(&c.kubeconfig)?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.auth_info.impersonate = Some(user.into());
    Ok(Client::try_from(config)?)
}

fn subject(user: &str) -> Subject {
    Subject {
        kind: "User".into(),
        name: user.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    }
}

/// `user` may do anything RBAC grants, so only the admission policies can refuse it.
async fn bind_cluster_admin(c: &Cluster, user: &str) -> anyhow::Result<()> {
    c.create(&ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(testkit::unique_name("gk-cm-admin")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "cluster-admin".into(),
        },
        subjects: Some(vec![subject(user)]),
    })
    .await?;
    Ok(())
}

/// `user` gets the built-in `edit` role in `ns`. The roles that make it up are bound one by one:
/// `edit` itself is filled in by kube-controller-manager's aggregation, which this control plane
/// does not run.
async fn bind_edit(c: &Cluster, ns: &str, user: &str) -> anyhow::Result<()> {
    for role in ["system:aggregate-to-edit", "system:aggregate-to-view"] {
        c.create(&RoleBinding {
            metadata: ObjectMeta {
                name: Some(format!("tenant-{}", role.rsplit('-').next().unwrap())),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: role.into(),
            },
            subjects: Some(vec![subject(user)]),
        })
        .await?;
    }
    Ok(())
}

/// The policies and bindings of `template`, rendered for `release` in `ns`, created.
async fn install_policies(
    c: &Cluster,
    release: &str,
    ns: &str,
    template: &str,
) -> anyhow::Result<Vec<String>> {
    let docs = testkit::chart::render_release(
        release,
        &["-n", ns, "--show-only", &format!("templates/{template}")],
    )
    .expect("helm renders");
    let mut names = Vec::new();
    for d in docs {
        match d["kind"].as_str() {
            Some("ValidatingAdmissionPolicy") => {
                let p: ValidatingAdmissionPolicy = serde_norway::from_value(d)?;
                names.push(p.metadata.name.clone().unwrap());
                c.create(&p).await?;
            }
            Some("ValidatingAdmissionPolicyBinding") => {
                c.create(&serde_norway::from_value::<ValidatingAdmissionPolicyBinding>(d)?)
                    .await?;
            }
            _ => {}
        }
    }
    Ok(names)
}

fn gated_pod(ns: &str, name: &str, gates: &[&str]) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulingGates": gates.iter().map(|g| json!({"name": g})).collect::<Vec<_>>(),
            "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]},
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }))?)
}

fn gates_of(p: &Pod) -> Vec<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.name)
        .collect()
}

fn refusal(r: Result<Pod, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => s.message,
        other => panic!("not refused: {other:?}"),
    }
}

/// A policy takes effect a moment after it is created (the apiserver's informer): until a
/// removal of the gate by `tenant` on a probe pod is refused, bounded.
async fn wait_gate_owned(c: &Cluster, tenant: &Api<Pod>, ns: &str) -> anyhow::Result<()> {
    let admin: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let remove = json!([{"op": "remove", "path": "/spec/schedulingGates"}]);
    for i in 0..60 {
        let name = format!("probe-{i}");
        admin
            .create(&PostParams::default(), &gated_pod(ns, &name, &[GATE])?)
            .await?;
        let r = tenant
            .patch(&name, &PatchParams::default(), &json_patch(&remove))
            .await;
        if matches!(r, Err(kube::Error::Api(ref s)) if s.code == 403) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("the gate-owner policy never took effect")
}

fn json_patch(v: &serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Json(serde_json::from_value(v.clone()).expect("a JSON patch"))
}

#[tokio::test]
async fn a_tenant_can_not_take_the_gate_off_and_groundskeeper_can() -> anyhow::Result<()> {
    let test = "a_tenant_can_not_take_the_gate_off_and_groundskeeper_can";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    if testkit::chart::helm().is_none() {
        testkit::skipped(test, "no helm");
        return Ok(());
    }
    let release_ns = c.namespace("gk-guards").await?;
    let release = testkit::unique_name("gkg");
    let ns = c.namespace("tenant").await?;
    let tenant_user = "tenant";
    bind_edit(&c, &ns, tenant_user).await?;
    let policies =
        install_policies(&c, &release, &release_ns, "sysctl-placement-guard.yaml").await?;
    assert!(
        policies.iter().any(|p| p.ends_with("sysctl-gate-owner")),
        "{policies:?}"
    );

    let tenant: Api<Pod> = Api::namespaced(as_user(&c, tenant_user).await?, &ns);
    let admin: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    wait_gate_owned(&c, &tenant, &ns).await?;

    admin
        .create(
            &PostParams::default(),
            &gated_pod(&ns, "held", &["example.com/quota", GATE])?,
        )
        .await?;
    // Every way a tenant removes it: the JSON patch of the whole list, of the one entry, a
    // merge patch, a replace of the whole pod (kubectl edit).
    for (how, patch) in [
        (
            "json remove of the list",
            json_patch(&json!([{"op": "remove", "path": "/spec/schedulingGates"}])),
        ),
        (
            "json remove of the entry",
            json_patch(&json!([{"op": "remove", "path": "/spec/schedulingGates/1"}])),
        ),
        (
            "merge patch",
            Patch::Merge(json!({"spec": {"schedulingGates": [{"name": "example.com/quota"}]}})),
        ),
    ] {
        let message = refusal(tenant.patch("held", &PatchParams::default(), &patch).await);
        assert!(
            message.contains(GATE)
                && message.contains(&format!("kubectl groundskeeper why pod held -n {ns}")),
            "{how}: {message}"
        );
    }
    let mut edited = tenant.get("held").await?;
    edited.spec.as_mut().unwrap().scheduling_gates = None;
    refusal(
        tenant
            .replace("held", &PostParams::default(), &edited)
            .await,
    );
    assert_eq!(
        gates_of(&admin.get("held").await?),
        vec!["example.com/quota", GATE]
    );

    // What the tenant may still do: remove a gate of their own, relabel, delete.
    tenant
        .patch(
            "held",
            &PatchParams::default(),
            &json_patch(&json!([
                {"op": "test", "path": "/spec/schedulingGates/0/name", "value": "example.com/quota"},
                {"op": "remove", "path": "/spec/schedulingGates/0"},
            ])),
        )
        .await?;
    tenant
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await?;
    assert_eq!(gates_of(&admin.get("held").await?), vec![GATE]);

    // A binding is not the tenant's to make (edit grants no pods/binding), and the apiserver
    // binds no gated pod at all.
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some("held".into()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        target: k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        },
    };
    match tenant
        .create_subresource::<serde_json::Value, serde_json::Value>(
            "binding",
            "held",
            &PostParams::default(),
            &serde_json::to_value(&binding)?,
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("the tenant bound a pod: {other:?}"),
    }

    // groundskeeper's controller-manager may (it places the pod).
    let cm_user =
        format!("system:serviceaccount:{release_ns}:{release}-groundskeeper-controller-manager");
    bind_cluster_admin(&c, &cm_user).await?;
    let cm: Api<Pod> = Api::namespaced(as_user(&c, &cm_user).await?, &ns);
    cm.patch(
        "held",
        &PatchParams::default(),
        &json_patch(&json!([{"op": "remove", "path": "/spec/schedulingGates"}])),
    )
    .await?;
    assert!(gates_of(&admin.get("held").await?).is_empty());
    Ok(())
}

#[tokio::test]
async fn the_controller_manager_changes_only_what_its_controllers_write() -> anyhow::Result<()> {
    let test = "the_controller_manager_changes_only_what_its_controllers_write";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    if testkit::chart::helm().is_none() {
        testkit::skipped(test, "no helm");
        return Ok(());
    }
    let release_ns = c.namespace("gk-guards").await?;
    let release = testkit::unique_name("gkf");
    let ns = c.namespace("workload").await?;
    let policies = install_policies(
        &c,
        &release,
        &release_ns,
        "controller-manager-own-objects.yaml",
    )
    .await?;
    assert!(
        policies
            .iter()
            .any(|p| p.ends_with("controller-manager-fields")),
        "{policies:?}"
    );
    let cm_user =
        format!("system:serviceaccount:{release_ns}:{release}-groundskeeper-controller-manager");
    bind_cluster_admin(&c, &cm_user).await?;
    let cm_client = as_user(&c, &cm_user).await?;

    // The chart's two webhook configurations, narrowed to no namespace (no webhook runs here).
    let docs = testkit::chart::render_release(
        &release,
        &[
            "-n",
            &release_ns,
            "--show-only",
            "templates/sysctl-webhook.yaml",
        ],
    )
    .expect("helm renders");
    let never =
        json!({"matchExpressions": [{"key": "gk-test", "operator": "In", "values": ["never"]}]});
    let mut validating = None;
    let mut mutating = None;
    for mut d in docs {
        let mut v: serde_json::Value = serde_json::to_value(&d)?;
        for w in v["webhooks"].as_array_mut().into_iter().flatten() {
            w["namespaceSelector"] = never.clone();
        }
        d = serde_norway::to_value(&v)?;
        match d["kind"].as_str() {
            Some("ValidatingWebhookConfiguration") => {
                let o: ValidatingWebhookConfiguration = serde_norway::from_value(d)?;
                validating = Some(c.create(&o).await?.metadata.name.unwrap());
            }
            Some("MutatingWebhookConfiguration") => {
                let o: MutatingWebhookConfiguration = serde_norway::from_value(d)?;
                mutating = Some(c.create(&o).await?.metadata.name.unwrap());
            }
            _ => {}
        }
    }
    let (validating, mutating) = (validating.unwrap(), mutating.unwrap());
    let vwc: Api<ValidatingWebhookConfiguration> = Api::all(cm_client.clone());
    let mwc: Api<MutatingWebhookConfiguration> = Api::all(cm_client.clone());
    let refused = |r: Result<serde_json::Value, kube::Error>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {
            assert!(
                s.message.contains("groundskeeper controller-manager may"),
                "{what}: {s:?}"
            )
        }
        other => panic!("{what}: not refused: {other:?}"),
    };
    let as_value = |r: Result<ValidatingWebhookConfiguration, kube::Error>| {
        r.map(|o| serde_json::to_value(o).unwrap())
    };
    // The policy takes effect a moment after it is created: until a forbidden change is refused.
    // Each probe changes something (a label of a new value), so one that lands before the
    // policy does never turns the next into a no-op the policy would let through.
    let probe = std::sync::atomic::AtomicUsize::new(0);
    testkit::wait_for(Duration::from_secs(30), "the field policy", || async {
        let n = probe.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let label = json_patch(&json!([
            {"op": "add", "path": "/metadata/labels/gk-probe", "value": n.to_string()}
        ]));
        Ok(vwc
            .patch(&validating, &PatchParams::default(), &label)
            .await
            .is_err())
    })
    .await?;
    // The caBundle: allowed, in each webhook of both.
    let bundle = json!([
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "bmV3"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "bmV3"},
    ]);
    vwc.patch(&validating, &PatchParams::default(), &json_patch(&bundle))
        .await?;
    mwc.patch(
        &mutating,
        &PatchParams::default(),
        &json_patch(
            &json!([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "bmV3"}]),
        ),
    )
    .await?;
    for (what, patch) in [
        (
            "failurePolicy",
            json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}]),
        ),
        (
            "rules",
            json!([{"op": "replace", "path": "/webhooks/0/rules/0/operations", "value": ["DELETE"]}]),
        ),
        (
            "namespaceSelector",
            json!([{"op": "remove", "path": "/webhooks/0/namespaceSelector"}]),
        ),
        (
            "matchConditions",
            json!([{"op": "remove", "path": "/webhooks/1/matchConditions"}]),
        ),
        (
            "service",
            json!([{"op": "replace", "path": "/webhooks/0/clientConfig/service/name", "value": "elsewhere"}]),
        ),
        (
            "a webhook removed",
            json!([{"op": "remove", "path": "/webhooks/1"}]),
        ),
        (
            "a label",
            json!([{"op": "add", "path": "/metadata/labels/x", "value": "y"}]),
        ),
    ] {
        refused(
            as_value(
                vwc.patch(&validating, &PatchParams::default(), &json_patch(&patch))
                    .await,
            ),
            what,
        );
    }
    refused(
        mwc.patch(
            &mutating,
            &PatchParams::default(),
            &json_patch(
                &json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]),
            ),
        )
        .await
        .map(|o| serde_json::to_value(o).unwrap()),
        "the gate's failurePolicy",
    );

    // pods/status: PodGC's patch and the placement's condition go through; nothing else.
    let admin: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let cm: Api<Pod> = Api::namespaced(cm_client, &ns);
    let mut pod = gated_pod(&ns, "p", &[])?;
    pod.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    let pod = admin.create(&PostParams::default(), &pod).await?;
    let uid = pod.metadata.uid.clone().unwrap();
    cm.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": [{
            "type": "groundskeeper.dev/SysctlPlacement", "status": "False",
            "reason": "NoNodeAdmitsSysctls", "message": "no node admits kernel.msgmax",
        }]}})),
    )
    .await?;
    for (what, patch) in [
        (
            "another condition",
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
        ),
        (
            "a pod IP",
            json!({"status": {"podIP": "10.0.0.9", "podIPs": [{"ip": "10.0.0.9"}]}}),
        ),
        ("phase Succeeded", json!({"status": {"phase": "Succeeded"}})),
        ("a status message", json!({"status": {"message": "hello"}})),
    ] {
        refused(
            cm.patch_status("p", &PatchParams::default(), &Patch::Strategic(patch))
                .await
                .map(|o| serde_json::to_value(o).unwrap()),
            what,
        );
    }
    // Metadata through the status: refused, or dropped by the apiserver; never applied.
    let r = cm
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
        )
        .await;
    if let Err(kube::Error::Api(s)) = &r {
        assert_eq!(s.code, 403, "{s:?}");
    }
    assert_eq!(
        admin.get("p").await?.metadata.labels.unwrap()["app"],
        "web",
        "a label changed through pods/status"
    );
    cm.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Strategic(json!({"metadata": {"uid": uid}, "status": {
            "phase": "Failed",
            "conditions": [{"type": "DisruptionTarget", "status": "True",
                "reason": "DeletionByPodGC", "message": "PodGC: node no longer exists"}],
        }})),
    )
    .await?;
    let after = admin.get("p").await?;
    assert_eq!(after.status.unwrap().phase.as_deref(), Some("Failed"));
    Ok(())
}
