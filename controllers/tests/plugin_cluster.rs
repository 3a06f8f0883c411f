//! `kubectl-groundskeeper` against a real apiserver: what blocks a ServiceCIDR's deletion, a
//! pod the real PodGC collected (and one it left, and one that is gone), a Pending pod kept off
//! nodes by their sysctl verdicts, `sysctl check` on a node, and what it must not do: it
//! answers with read-only rights, and writes nothing even with an admin's.

use std::{collections::BTreeMap, time::Duration};

use groundskeeper_sysctl_rules::crd::{Mode, SysctlPolicy, SysctlPolicySpec, crd_yaml};
use k8s_openapi::{
    api::{core::v1::Pod, rbac::v1::PolicyRule},
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

mod plugin_common;
use plugin_common::{octet, plugin, plugin_with_input, read_only};
use testkit::{
    Binary, Cluster,
    networking::{LABEL_FAMILY, LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR, ip_address, service_cidr},
    unique_name, wait_for,
    webhook::ready_node,
};

const WAIT: Duration = Duration::from_secs(30);
const HOLD: &str = "groundskeeper.dev/test-hold";

async fn managed_ip(c: &Cluster, ip: &str, service: &str) -> anyhow::Result<()> {
    let labels = [
        (LABEL_FAMILY, "IPv4"),
        (LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR),
    ];
    c.create(&ip_address(ip, &labels, "shop", service)).await?;
    Ok(())
}

#[tokio::test]
async fn why_servicecidr_names_the_ip_only_it_holds_and_clears_one_nothing_blocks()
-> anyhow::Result<()> {
    let test = "why_servicecidr_names_the_ip_only_it_holds_and_clears_one_nothing_blocks";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let o = octet();
    let blocked = unique_name("gk-plugin-blocked");
    c.create(&service_cidr(&blocked, [format!("10.207.{o}.0/24")]))
        .await?;
    managed_ip(&c, &format!("10.207.{o}.9"), "web").await?;
    let clear = unique_name("gk-plugin-clear");
    c.create(&service_cidr(&clear, [format!("10.208.{o}.0/24")]))
        .await?;

    let a = plugin(&c.kubeconfig, &["why", "servicecidr", &blocked]).await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(
        a.out.contains(&format!("10.207.{o}.9\tservices shop/web")),
        "{a}"
    );
    assert!(a.out.contains("block its deletion"), "{a}");
    let j = plugin(
        &c.kubeconfig,
        &["why", "servicecidr", &blocked, "-o", "json"],
    )
    .await?
    .json();
    assert_eq!(j["blocked"], true, "{j}");
    assert_eq!(j["blockers"][0]["ip"], format!("10.207.{o}.9"), "{j}");
    assert_eq!(j["blockers"][0]["owner"], "services shop/web", "{j}");

    let a = plugin(&c.kubeconfig, &["why", "servicecidr", &clear]).await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(a.out.contains("nothing blocks"), "{a}");
    assert!(!a.out.contains(&format!("10.207.{o}.9")), "{a}");

    let a = plugin(&c.kubeconfig, &["why", "servicecidr", "gk-no-such-cidr"]).await?;
    assert_eq!(a.code, 1, "{a}");
    assert!(a.err.contains("not found"), "{a}");
    Ok(())
}

/// A pod bound to `node`, optionally held by a finalizer.
fn bound(ns: &str, name: &str, node: &str, held: bool) -> Pod {
    let mut p = testkit::bound_pod(ns, name, node);
    if held {
        p.metadata.finalizers = Some(vec![HOLD.into()]);
    }
    p
}

#[tokio::test]
async fn why_pod_reads_back_what_podgc_did_and_why_it_left_a_pod() -> anyhow::Result<()> {
    let test = "why_pod_reads_back_what_podgc_did_and_why_it_left_a_pod";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let ns = c.namespace_for_pods("gk-plugin-podgc", WAIT).await?;
    let gone_node = unique_name("gk-plugin-gone");
    let live = unique_name("gk-plugin-live");
    c.create(&ready_node(&live, BTreeMap::new(), "6.1.0", "v1.36.2"))
        .await?;
    c.create(&bound(&ns, "held-orphan", &gone_node, true))
        .await?;
    c.create(&bound(&ns, "orphan", &gone_node, false)).await?;
    c.create(&bound(&ns, "kept", &live, false)).await?;
    // Finished an hour ago on a node that exists: the TTL's to take, and a finalizer keeps it.
    c.create(&bound(&ns, "held-done", &live, true)).await?;
    finish(&c, &ns, "held-done").await?;

    // Before PodGC runs: the orphan pass will take it.
    let a = plugin(&c.kubeconfig, &["why", "pod", "held-orphan", "-n", &ns]).await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(
        a.out
            .contains("not collected yet; the orphaned pass chooses it"),
        "{a}"
    );

    // The real PodGC, with a short quarantine.
    let (_manager, _admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-plugin-podgc",
        &[
            "--leader-elect=false",
            "--controllers=podgc",
            "--gc-period=500ms",
            "--orphan-quarantine=1s",
            "--terminated-pod-ttl=2s",
        ],
        &[],
    )?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    wait_for(
        WAIT,
        "PodGC to collect both orphans and the finished pod",
        || async {
            let held = pods.get("held-orphan").await?;
            let done = pods.get("held-done").await?;
            Ok(held.metadata.deletion_timestamp.is_some()
                && done.metadata.deletion_timestamp.is_some()
                && pods.get_opt("orphan").await?.is_none())
        },
    )
    .await?;
    let kept_version = pods.get("kept").await?.resource_version();

    let a = plugin(&c.kubeconfig, &["why", "pod", "held-orphan", "-n", &ns]).await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(
        a.out.contains("collected by PodGC, pass orphaned, at "),
        "{a}"
    );
    assert!(a.out.contains(&format!("finalizers {HOLD} hold it")), "{a}");
    let j = plugin(
        &c.kubeconfig,
        &["why", "pod", "held-orphan", "-n", &ns, "-o", "json"],
    )
    .await?
    .json();
    assert_eq!(j["podgc"]["collected"]["pass"], "orphaned", "{j}");
    assert_eq!(j["podgc"]["collected"]["certain"], true, "{j}");
    assert!(j["podgc"]["collected"]["at"].is_string(), "{j}");

    // Force-deleted without a mark of its own: the pass its state fits, said as inferred.
    let a = plugin(
        &c.kubeconfig,
        &[
            "why",
            "pod",
            "held-done",
            "-n",
            &ns,
            "--terminated-pod-ttl",
            "2s",
        ],
    )
    .await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(
        a.out
            .contains("collected by PodGC, pass terminated, ttl or namespace-threshold, at "),
        "{a}"
    );
    assert!(a.out.contains("(inferred)"), "{a}");
    assert!(
        a.out
            .lines()
            .any(|l| l.contains("ttl") && l.contains("chooses it")),
        "{a}"
    );

    // Gone: an error (exit 1), and where the answer is instead.
    let a = plugin(&c.kubeconfig, &["why", "pod", "orphan", "-n", &ns]).await?;
    assert_eq!(a.code, 1, "{a}");
    assert!(a.err.contains("not found"), "{a}");
    assert!(a.err.contains("force-deleted pod"), "{a}");

    // Left alone, and why; asking about it changed nothing on it.
    let a = plugin(&c.kubeconfig, &["why", "pod", "kept", "-n", &ns]).await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(a.out.contains("not collected by PodGC"), "{a}");
    assert!(a.out.contains(&format!("its node {live:?} exists")), "{a}");
    assert!(a.out.contains("not terminating"), "{a}");
    assert_eq!(pods.get("kept").await?.resource_version(), kept_version);
    Ok(())
}

/// Marks a pod Succeeded as a kubelet would, its container finished an hour ago.
async fn finish(c: &Cluster, ns: &str, name: &str) -> anyhow::Result<()> {
    let at = |ago: i64| {
        (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(ago))
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let status = json!({"status": {"phase": "Succeeded", "containerStatuses": [{
        "name": "c", "image": "registry.invalid/none", "imageID": "",
        "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "startedAt": at(3700), "finishedAt": at(3600)}}
    }]}});
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

/// Labels unique to this run, so the policies select only this test's nodes.
struct Pools {
    test: String,
    db: String,
    web: String,
}

impl Pools {
    fn new() -> Self {
        let u = unique_name("p");
        Pools {
            test: u.clone(),
            db: format!("{u}-db"),
            web: format!("{u}-web"),
        }
    }

    fn labels(&self, pool: &str) -> BTreeMap<String, String> {
        [
            ("gk-plugin-test".to_string(), self.test.clone()),
            ("gk-plugin-pool".to_string(), pool.to_string()),
        ]
        .into()
    }
}

fn policy(name: &str, pool: &str, allow: &[&str]) -> SysctlPolicy {
    SysctlPolicy::new(
        name,
        SysctlPolicySpec {
            allowed_unsafe_sysctls: allow.iter().map(|s| s.to_string()).collect(),
            node_selector: Some(LabelSelector {
                match_labels: Some([("gk-plugin-pool".to_string(), pool.to_string())].into()),
                ..Default::default()
            }),
            mode: Mode::Enforce,
        },
    )
}

/// Two nodes of this run: `db` (kubelet v1.37, its Enforce policy allows
/// `net.core.somaxconn`) and `web` (kubelet v1.36, its Enforce policy allows nothing more).
async fn pools(c: &Cluster) -> anyhow::Result<(Pools, String, String, String)> {
    c.ensure_crd(&crd_yaml()).await?;
    let p = Pools::new();
    let db = unique_name("gk-plugin-db");
    let web = unique_name("gk-plugin-web");
    c.create(&ready_node(
        &db,
        p.labels(&p.db),
        "6.1.0-18-amd64",
        "v1.37.0",
    ))
    .await?;
    c.create(&ready_node(
        &web,
        p.labels(&p.web),
        "6.1.0-18-amd64",
        "v1.36.2",
    ))
    .await?;
    let web_policy = unique_name("gk-plugin-web-enforce");
    c.create(&policy(
        &unique_name("gk-plugin-db-enforce"),
        &p.db,
        &["net.core.somaxconn"],
    ))
    .await?;
    c.create(&policy(&web_policy, &p.web, &[])).await?;
    Ok((p, db, web, web_policy))
}

#[tokio::test]
async fn why_pending_pod_names_the_nodes_whose_sysctl_verdicts_keep_it_off() -> anyhow::Result<()> {
    let test = "why_pending_pod_names_the_nodes_whose_sysctl_verdicts_keep_it_off";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let (p, db, web, web_policy) = pools(&c).await?;
    let ns = c.namespace_for_pods("gk-plugin-pending", WAIT).await?;
    let mut pod = testkit::bound_pod(&ns, "wants-somaxconn", "");
    let spec = pod.spec.as_mut().unwrap();
    spec.node_name = None;
    spec.security_context = Some(testkit::sysctls(&["net.core.somaxconn"]));
    spec.node_selector = Some([("gk-plugin-test".to_string(), p.test.clone())].into());
    c.create(&pod).await?;

    let a = plugin(&c.kubeconfig, &["why", "pod", "wants-somaxconn", "-n", &ns]).await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(
        a.out.contains(
            "Sysctls net.core.somaxconn: 1 of 2 node(s) its own constraints allow refuse it"
        ),
        "{a}"
    );
    let line = |node: &str| {
        a.out
            .lines()
            .find(|l| l.trim_start().starts_with(node))
            .map(String::from)
    };
    let web_line = line(&web).unwrap_or_else(|| panic!("no line for {web}: {a}"));
    assert!(web_line.contains("refused"), "{web_line}");
    assert!(web_line.contains(&web_policy), "{web_line}");
    let db_line = line(&db).unwrap_or_else(|| panic!("no line for {db}: {a}"));
    assert!(db_line.contains("allowed"), "{db_line}");

    let j = plugin(
        &c.kubeconfig,
        &["why", "pod", "wants-somaxconn", "-n", &ns, "-o", "json"],
    )
    .await?
    .json();
    assert_eq!(
        j["sysctl"]["nodes"].as_array().map(Vec::len),
        Some(2),
        "{j}"
    );
    Ok(())
}

#[tokio::test]
async fn sysctl_check_says_a_nodes_verdict_from_its_policies_and_kubelet() -> anyhow::Result<()> {
    let test = "sysctl_check_says_a_nodes_verdict_from_its_policies_and_kubelet";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let (_, db, web, web_policy) = pools(&c).await?;
    // Safe from kubelet v1.37 on: allowed on db (v1.37), refused on web (v1.36, Enforce).
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata: {name: idle}\nspec:\n  securityContext:\n    sysctls: [{name: net.ipv4.tcp_slow_start_after_idle, value: \"0\"}]\n  containers: [{name: c, image: i}]\n";
    let file = std::env::temp_dir().join(format!("{}.yaml", unique_name("gk-plugin-pod")));
    std::fs::write(&file, manifest)?;
    let file_arg = file.to_string_lossy().into_owned();

    let a = plugin(
        &c.kubeconfig,
        &["sysctl", "check", "-f", &file_arg, "--node", &web],
    )
    .await?;
    assert_eq!(a.code, 0, "{a}");
    assert!(
        a.out.contains(&format!("Pod/idle on node {web}: refused")),
        "{a}"
    );
    assert!(a.out.contains("kubelet v1.36.2"), "{a}");
    assert!(
        a.out
            .contains(&format!("mode Enforce (SysctlPolicy {web_policy})")),
        "{a}"
    );
    assert!(a.out.contains("not allowlisted"), "{a}");

    let a = plugin_with_input(
        &c.kubeconfig,
        &["sysctl", "check", "-f", "-", "--node", &db, "-o", "json"],
        Some(manifest),
    )
    .await?;
    assert_eq!(a.code, 0, "{a}");
    let j = a.json();
    assert_eq!(j[0]["verdict"], "allowed", "{j}");
    assert_eq!(j[0]["kubelet"], "v1.37.0", "{j}");

    let a = plugin(
        &c.kubeconfig,
        &[
            "sysctl",
            "check",
            "-f",
            &file_arg,
            "--node",
            "gk-no-such-node",
        ],
    )
    .await?;
    assert_eq!(a.code, 1, "{a}");
    assert!(a.err.contains("not found"), "{a}");
    let _ = std::fs::remove_file(&file);
    Ok(())
}

/// What the plugin needs, and nothing more: get and list.
#[tokio::test]
async fn it_answers_with_read_only_rights_and_never_writes() -> anyhow::Result<()> {
    let test = "it_answers_with_read_only_rights_and_never_writes";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let (_, _, web, _) = pools(&c).await?;
    let ns = c.namespace_for_pods("gk-plugin-rbac", WAIT).await?;
    // On a node that exists: the PodGC another test runs must not take it.
    c.create(&bound(&ns, "running", &web, false)).await?;
    let mut pending = testkit::bound_pod(&ns, "pending", "");
    let spec = pending.spec.as_mut().unwrap();
    spec.node_name = None;
    spec.security_context = Some(testkit::sysctls(&["net.core.somaxconn"]));
    c.create(&pending).await?;
    let cidr = unique_name("gk-plugin-rbac");
    c.create(&service_cidr(&cidr, [format!("10.209.{}.0/24", octet())]))
        .await?;
    let file = std::env::temp_dir().join(format!("{}.yaml", unique_name("gk-plugin-pod")));
    std::fs::write(
        &file,
        "kind: Pod\nmetadata: {name: p}\nspec:\n  securityContext:\n    sysctls: [{name: net.core.somaxconn, value: \"1\"}]\n  containers: [{name: c, image: i}]\n",
    )?;
    let file_arg = file.to_string_lossy().into_owned();
    let started = jiff::Timestamp::now();
    let asks: Vec<Vec<&str>> = vec![
        vec!["why", "servicecidr", &cidr],
        vec!["why", "pod", "running", "-n", &ns],
        vec!["why", "pod", "pending", "-n", &ns],
        vec!["sysctl", "check", "-f", &file_arg, "--node", &web],
    ];

    // Bound to get and list alone, every command answers.
    let reader = c
        .as_service_account_with(&ns, read_only(), Vec::new())
        .await?;
    for args in &asks {
        let a = plugin(&reader, args).await?;
        assert_eq!(a.code, 0, "{args:?} as a reader: {a}");
    }
    // Events only help explain a pod that is gone: without them it is still "not found".
    let no_events: Vec<PolicyRule> = read_only()
        .into_iter()
        .map(|mut r| {
            if let Some(res) = r.resources.as_mut() {
                res.retain(|x| x != "events");
            }
            r
        })
        .collect();
    let partial = c
        .as_service_account_with(&ns, no_events, Vec::new())
        .await?;
    let a = plugin(&partial, &["why", "pod", "never-was", "-n", &ns]).await?;
    assert_eq!(a.code, 1, "{a}");
    assert!(
        a.err.contains("not found") && !a.err.contains("forbidden"),
        "{a}"
    );
    // Without them: an error that says forbidden, exit 1.
    let nobody = c
        .as_service_account_with(&ns, Vec::new(), Vec::new())
        .await?;
    let a = plugin(&nobody, &asks[1]).await?;
    assert_eq!(a.code, 1, "{a}");
    assert!(a.err.contains("forbidden"), "{a}");

    // With every right (the admin's kubeconfig), still not one write: the audit log (writes
    // only) holds no request from the plugin.
    for args in &asks {
        let a = plugin(&c.kubeconfig, args).await?;
        assert_eq!(a.code, 0, "{args:?} as admin: {a}");
    }
    let _ = std::fs::remove_file(&file);
    let Some(cp) = c.control_plane else {
        testkit::skipped(
            test,
            "the audit log is only read on the tests' own control plane",
        );
        return Ok(());
    };
    // The apiserver flushes its audit log in batches: wait for a write after ours to show.
    let marker = unique_name("gk-plugin-marker");
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": marker}}))?,
        )
        .await?;
    wait_for(WAIT, "the marker write in the audit log", || async {
        Ok(testkit::audit::read(&cp.audit_log)?
            .iter()
            .any(|e| e.object_ref.name == marker))
    })
    .await?;
    let writes: Vec<String> = testkit::audit::read(&cp.audit_log)?
        .into_iter()
        .filter(|e| e.request_received_timestamp >= started)
        .filter(|e| e.user_agent.starts_with("kubectl-groundskeeper"))
        .map(|e| format!("{} {:?}", e.verb, e.object_ref.name))
        .collect();
    assert!(writes.is_empty(), "the plugin wrote: {writes:?}");
    Ok(())
}
