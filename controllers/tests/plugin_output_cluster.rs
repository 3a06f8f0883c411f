//! `kubectl-groundskeeper` as admins use kubectl against a real apiserver: `get servicecidrs`
//! and its table, `-o json|yaml` of every answer (the same facts in both), and `--as` and
//! `--as-group` sent as kubectl sends them.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::{
        networking::v1::ServiceCIDR,
        rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::{Value, json};
use testkit::{
    networking::{LABEL_FAMILY, LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR, ip_address, service_cidr},
    unique_name,
    webhook::ready_node,
};

#[allow(dead_code)] // not every test file uses every helper
mod plugin_common;
use plugin_common::{octet, plugin, read_only};

const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";

#[tokio::test]
async fn get_servicecidrs_shows_ready_finalizer_and_what_blocks_a_deletion() -> anyhow::Result<()> {
    let test = "get_servicecidrs_shows_ready_finalizer_and_what_blocks_a_deletion";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let o = octet();
    let api: Api<ServiceCIDR> = Api::all(c.client.clone());
    let held = unique_name("gk-plugin-get-held");
    let mut cidr = service_cidr(&held, [format!("10.211.{o}.0/24")]);
    cidr.metadata.finalizers = Some(vec![FINALIZER.into()]);
    c.create(&cidr).await?;
    let labels = [
        (LABEL_FAMILY, "IPv4"),
        (LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR),
    ];
    for i in 1..=4 {
        c.create(&ip_address(
            &format!("10.211.{o}.{i}"),
            &labels,
            "shop",
            "web",
        ))
        .await?;
    }
    // What the controller writes once a deletion waits.
    let condition = json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "Terminating", "message": "waiting",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    api.patch_status(&held, &PatchParams::default(), &Patch::Merge(&condition))
        .await?;
    api.delete(&held, &DeleteParams::default()).await?;
    let plain = unique_name("gk-plugin-get-plain");
    c.create(&service_cidr(&plain, [format!("10.212.{o}.0/24")]))
        .await?;

    let a = plugin(&c.kubeconfig, &["get", "servicecidrs"]).await?;
    assert_eq!(a.code, 0, "{a}");
    let header = a.out.lines().next().unwrap_or_default();
    let columns: Vec<&str> = header
        .split("   ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(
        columns,
        ["NAME", "CIDRS", "READY", "FINALIZER", "BLOCKED BY", "AGE"],
        "{a}"
    );
    let row = |name: &str| {
        a.out
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}: {a}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(
        row(&held).contains(&format!(
            "False (Terminating) yes 4: 10.211.{o}.1,10.211.{o}.2,10.211.{o}.3,..."
        )),
        "{a}"
    );
    assert!(row(&plain).contains("<unknown> no <none>"), "{a}");

    for output in ["json", "yaml"] {
        let a = plugin(
            &c.kubeconfig,
            &["get", "servicecidr", &held, &plain, "-o", output],
        )
        .await?;
        assert_eq!(a.code, 0, "{a}");
        let v: Value = match output {
            "json" => a.json(),
            _ => serde_norway::from_str(&a.out)?,
        };
        let items = v["items"].as_array().expect("items");
        assert_eq!(items.len(), 2, "{v}");
        assert_eq!(items[0]["name"], held.as_str(), "{v}");
        assert_eq!(items[0]["finalizer"], true, "{v}");
        assert_eq!(items[0]["deleting"], true, "{v}");
        assert_eq!(items[0]["ready"]["reason"], "Terminating", "{v}");
        assert_eq!(items[0]["blockedBy"]["count"], 4, "{v}");
        assert_eq!(
            items[0]["blockedBy"]["first"][0]["owner"], "services shop/web",
            "{v}"
        );
        assert_eq!(items[1]["blockedBy"], Value::Null, "{v}");
        assert_eq!(items[1]["finalizer"], false, "{v}");
    }
    let a = plugin(&c.kubeconfig, &["get", "servicecidrs", "gk-no-such-cidr"]).await?;
    assert_eq!(a.code, 1, "{a}");
    assert!(a.err.contains("not found"), "{a}");

    let gone = json!({"metadata": {"finalizers": null}});
    api.patch(&held, &PatchParams::default(), &Patch::Merge(&gone))
        .await?;
    Ok(())
}

/// `-o json` and `-o yaml` of `args`: both exit 0, and say the same.
async fn both(kubeconfig: &std::path::Path, args: &[&str]) -> anyhow::Result<Value> {
    let mut got = Vec::new();
    for output in ["json", "yaml"] {
        let mut with = args.to_vec();
        with.extend(["-o", output]);
        let a = plugin(kubeconfig, &with).await?;
        assert_eq!(a.code, 0, "{with:?}: {a}");
        got.push(match output {
            "json" => a.json(),
            _ => serde_norway::from_str::<Value>(&a.out)
                .unwrap_or_else(|e| panic!("{with:?}: not YAML ({e}): {a}")),
        });
    }
    assert_eq!(got[0], got[1], "{args:?}: -o json and -o yaml differ");
    Ok(got.remove(0))
}

#[tokio::test]
async fn every_answer_prints_as_json_and_as_yaml() -> anyhow::Result<()> {
    let test = "every_answer_prints_as_json_and_as_yaml";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let ns = c
        .namespace_for_pods("gk-plugin-output", Duration::from_secs(30))
        .await?;
    let node = unique_name("gk-plugin-output");
    c.create(&ready_node(&node, BTreeMap::new(), "6.1.0", "v1.36.2"))
        .await?;
    c.create(&testkit::bound_pod(&ns, "kept", &node)).await?;
    let cidr = unique_name("gk-plugin-output");
    c.create(&service_cidr(&cidr, [format!("10.213.{}.0/24", octet())]))
        .await?;
    let file = std::env::temp_dir().join(format!("{}.yaml", unique_name("gk-plugin-output")));
    std::fs::write(
        &file,
        "kind: Pod\nmetadata: {name: p}\nspec:\n  securityContext:\n    sysctls: [{name: net.core.somaxconn, value: \"1\"}]\n  containers: [{name: c, image: i}]\n",
    )?;

    let v = both(&c.kubeconfig, &["why", "servicecidr", &cidr]).await?;
    assert_eq!(v["servicecidr"], cidr.as_str(), "{v}");
    assert_eq!(v["blocked"], false, "{v}");
    let v = both(&c.kubeconfig, &["why", "pod", "kept", "-n", &ns]).await?;
    assert_eq!(v["pod"], format!("{ns}/kept"), "{v}");
    assert_eq!(v["podgc"]["collected"], Value::Null, "{v}");
    assert_eq!(
        v["podgc"]["passes"].as_array().map(Vec::len),
        Some(6),
        "{v}"
    );
    let v = both(
        &c.kubeconfig,
        &[
            "sysctl",
            "check",
            "-f",
            &file.to_string_lossy(),
            "--node",
            &node,
        ],
    )
    .await?;
    assert_eq!(v[0]["node"], node.as_str(), "{v}");
    assert_eq!(v[0]["sysctls"][0], "net.core.somaxconn", "{v}");
    let v = both(&c.kubeconfig, &["get", "servicecidrs", &cidr]).await?;
    assert_eq!(v["items"][0]["name"], cidr.as_str(), "{v}");
    let _ = std::fs::remove_file(&file);
    Ok(())
}

#[tokio::test]
async fn as_and_as_group_act_as_that_user_and_group() -> anyhow::Result<()> {
    let test = "as_and_as_group_act_as_that_user_and_group";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    // The plugin's read-only rules, bound to a group only.
    let name = unique_name("gk-plugin-as");
    let group = format!("{name}-readers");
    c.create(&ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        rules: Some(read_only()),
        ..Default::default()
    })
    .await?;
    c.create(&ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "Group".into(),
            name: group.clone(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        }]),
    })
    .await?;
    let user = format!("{name}-user");
    let ask = ["get", "servicecidrs"];

    // The admin as a user of no group: the apiserver refuses that user, by name.
    let a = plugin(&c.kubeconfig, &[&ask[..], &["--as", &user]].concat()).await?;
    assert_eq!(a.code, 1, "{a}");
    assert!(a.err.contains("forbidden") && a.err.contains(&user), "{a}");
    // The same user in the bound group (among others): answered.
    let as_group = [
        &ask[..],
        &["--as", &user, "--as-group", "other", "--as-group", &group],
    ]
    .concat();
    let a = plugin(&c.kubeconfig, &as_group).await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(a.out.starts_with("NAME"), "{a}");
    // As kubectl: the flags replace the kubeconfig's own impersonation (testkit's reader
    // kubeconfig impersonates a ServiceAccount that may read).
    let ns = c.namespace("gk-plugin-as").await?;
    let reader = c
        .as_service_account_with(&ns, read_only(), Vec::new())
        .await?;
    let a = plugin(&reader, &ask).await?;
    assert_eq!(a.code, 0, "{a}");
    let a = plugin(&reader, &[&ask[..], &["--as", &user]].concat()).await?;
    assert_eq!(a.code, 1, "{a}");
    assert!(a.err.contains("forbidden") && a.err.contains(&user), "{a}");
    Ok(())
}

#[tokio::test]
async fn why_pod_reads_podgcs_settings_from_the_controller_managers_deployment()
-> anyhow::Result<()> {
    let test = "why_pod_reads_podgcs_settings_from_the_controller_managers_deployment";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let ns = c
        .namespace_for_pods("gk-plugin-settings", Duration::from_secs(30))
        .await?;
    let node = unique_name("gk-plugin-settings");
    c.create(&ready_node(&node, BTreeMap::new(), "6.1.0", "v1.36.2"))
        .await?;
    c.create(&testkit::bound_pod(&ns, "kept", &node)).await?;
    let base = [
        "why",
        "pod",
        "kept",
        "-n",
        &ns,
        "--controller-manager-namespace",
        &ns,
        "-o",
        "json",
    ];

    // No Deployment there: the controller-manager's defaults, said so.
    let v = plugin(&c.kubeconfig, &base).await?.json();
    assert_eq!(v["settings"]["terminatedPodGcThreshold"], 12500, "{v}");
    assert_eq!(v["settings"]["source"]["deployment"], Value::Null, "{v}");

    // As the chart writes it: flags in args (among other controllers'), one in the env.
    let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "groundskeeper-controller-manager", "namespace": ns,
                     "labels": {"app.kubernetes.io/component": "controller-manager"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "gk-plugin-settings"}},
            "template": {
                "metadata": {"labels": {"app": "gk-plugin-settings"}},
                "spec": {"containers": [{
                    "name": "controller-manager",
                    "image": "groundskeeper:test",
                    "command": ["/usr/local/bin/controller-manager"],
                    "args": ["--leader-elect=true", "--controllers=podgc,servicecidr",
                             "--terminated-pod-gc-threshold=777", "--sysctl-default-mode=enforce"],
                    "env": [{"name": "GROUNDSKEEPER_TERMINATED_POD_TTL", "value": "90m"}],
                }]},
            },
        },
    }))?;
    c.create(&deployment).await?;
    let v = plugin(&c.kubeconfig, &base).await?.json();
    let want = format!("{ns}/groundskeeper-controller-manager");
    assert_eq!(v["settings"]["source"]["deployment"], want.as_str(), "{v}");
    assert_eq!(v["settings"]["terminatedPodGcThreshold"], 777, "{v}");
    assert_eq!(v["settings"]["terminatedPodTtlSeconds"], 5400, "{v}");
    assert_eq!(v["settings"]["sysctlDefaultMode"], "Enforce", "{v}");
    // A flag given to the plugin overrides the Deployment's.
    let a = plugin(
        &c.kubeconfig,
        &[
            &base[..5],
            &[
                "--controller-manager-namespace",
                &ns,
                "--terminated-pod-gc-threshold",
                "5",
            ],
        ]
        .concat(),
    )
    .await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(
        a.out.contains(&format!(
            "Settings: --terminated-pod-gc-threshold=5 --terminated-pod-ttl=5400s, unless given, from Deployment {want}"
        )),
        "{a}"
    );
    Ok(())
}
