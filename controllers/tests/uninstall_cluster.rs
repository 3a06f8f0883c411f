//! `controller-manager uninstall` (the chart's post-delete hook) against a real apiserver: the
//! Lease goes once no live holder has it; the finalizer goes from a ServiceCIDR that is not
//! being deleted, and stays on one being deleted while an IP would be orphaned; `--dry-run`
//! changes nothing.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use testkit::{
    Cluster,
    networking::{LABEL_FAMILY, LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR, ip_address, service_cidr},
    unique_name,
};

const BIN: &str = env!("CARGO_BIN_EXE_controller-manager");
const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";

fn octet() -> u8 {
    (std::process::id() % 200) as u8 + 30
}

async fn protected_cidr(c: &Cluster, name: &str, cidr: &str) -> anyhow::Result<()> {
    let mut obj = service_cidr(name, [cidr]);
    obj.metadata.finalizers = Some(vec![FINALIZER.into()]);
    c.create(&obj).await?;
    Ok(())
}

async fn uninstall(
    c: &Cluster,
    ns: &str,
    lease: &str,
    dry_run: bool,
) -> anyhow::Result<(i32, String)> {
    uninstall_as(&c.kubeconfig, ns, lease, dry_run).await
}

/// [`uninstall`] with the credentials of `kubeconfig`.
async fn uninstall_as(
    kubeconfig: &std::path::Path,
    ns: &str,
    lease: &str,
    dry_run: bool,
) -> anyhow::Result<(i32, String)> {
    let out = tokio::process::Command::new(BIN)
        .arg(format!("--dry-run={dry_run}"))
        .args([
            "uninstall",
            "--lease-namespace",
            ns,
            "--lease-name",
            lease,
            "--lease-wait",
            "20s",
        ])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await?;
    let text = format!(
        "{}{}",
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?
    );
    Ok((out.status.code().unwrap_or(-1), text))
}

fn finalizers(c: &ServiceCIDR) -> Vec<String> {
    c.finalizers().to_vec()
}

#[tokio::test]
async fn uninstall_removes_what_blocks_nobody_and_keeps_what_protects_ips() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("uninstall_removes_what_blocks_nobody_and_keeps_what_protects_ips").await
    else {
        return Ok(());
    };
    let ns = c.namespace("gk-uninstall").await?;
    let o = octet();
    let live = unique_name("gk-un-live");
    let doomed = unique_name("gk-un-doomed");
    protected_cidr(&c, &live, &format!("10.207.{o}.0/25")).await?;
    protected_cidr(&c, &doomed, &format!("10.207.{o}.128/25")).await?;
    c.create(&ip_address(
        &format!("10.207.{o}.130"),
        &[
            (LABEL_FAMILY, "IPv4"),
            (LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR),
        ],
        "team-a",
        "web",
    ))
    .await?;
    let cidrs: Api<ServiceCIDR> = Api::all(c.client.clone());
    cidrs.delete(&doomed, &DeleteParams::default()).await?;

    // A Lease whose holder last renewed 5 s ago with a 15 s duration: uninstall must wait.
    let lease_name = unique_name("gk-un-lease");
    let renewed = Timestamp::now() - jiff::SignedDuration::from_secs(5);
    c.create(&Lease {
        metadata: ObjectMeta {
            name: Some(lease_name.clone()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("gone-replica_1234".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed)),
            ..Default::default()
        }),
    })
    .await?;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &ns);

    // Dry run: says what it would do, does nothing.
    let (code, out) = uninstall(&c, &ns, &lease_name, true).await?;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("dry-run: would delete Lease"), "{out}");
    assert!(
        out.contains(&format!(
            "would remove the finalizer {FINALIZER} from ServiceCIDR {live}"
        )),
        "{out}"
    );
    assert!(leases.get_opt(&lease_name).await?.is_some());
    assert_eq!(
        finalizers(&cidrs.get(&live).await?),
        vec![FINALIZER.to_string()]
    );

    let started = std::time::Instant::now();
    let (code, out) = uninstall(&c, &ns, &lease_name, false).await?;
    assert_eq!(code, 0, "{out}");
    // The live holder's term (renewed 5 s before the dry run) had to run out first.
    assert!(
        started.elapsed() >= Duration::from_secs(5)
            || Timestamp::now().duration_since(renewed).as_secs() >= 15,
        "the Lease was deleted while its holder's term ran: {out}"
    );
    assert!(leases.get_opt(&lease_name).await?.is_none(), "{out}");
    assert!(finalizers(&cidrs.get(&live).await?).is_empty(), "{out}");
    let kept = cidrs.get(&doomed).await?;
    assert_eq!(finalizers(&kept), vec![FINALIZER.to_string()], "{out}");
    assert!(
        out.contains(&format!("kept the finalizer of ServiceCIDR {doomed}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("10.207.{o}.130")),
        "the blocker is named: {out}"
    );

    // Let the doomed ServiceCIDR go.
    cidrs
        .patch(
            &doomed,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    Ok(())
}

async fn skewed_lease(c: &Cluster, ns: &str, name: &str, renewed: Timestamp) -> anyhow::Result<()> {
    c.create(&Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("skewed-replica_1234".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed)),
            ..Default::default()
        }),
    })
    .await?;
    Ok(())
}

/// The hook judges the Lease as the electors do, by watching its record change, never by
/// comparing `renewTime` with its own clock: a holder whose clock is an hour behind, renewing
/// every 2 s, is live and its Lease stays; a holder an hour ahead that no longer renews is
/// expired one lease duration after the hook first saw the Lease, and only then deleted.
#[tokio::test]
async fn uninstall_judges_the_lease_by_its_renewals_not_its_clock() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("uninstall_judges_the_lease_by_its_renewals_not_its_clock").await
    else {
        return Ok(());
    };
    let ns = c.namespace("gk-uninstall").await?;
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &ns);
    let hour = jiff::SignedDuration::from_hours(1);

    let live = unique_name("gk-un-skewed-live");
    skewed_lease(&c, &ns, &live, Timestamp::now() - hour).await?;
    let renewer = {
        let (leases, live) = (leases.clone(), live.clone());
        tokio::spawn(async move {
            loop {
                let renewed = MicroTime(Timestamp::now() - hour);
                let body = json!({"spec": {"renewTime": renewed}});
                let _ = leases
                    .patch(&live, &PatchParams::default(), &Patch::Merge(body))
                    .await;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
    };
    let result = uninstall(&c, &ns, &live, false).await;
    renewer.abort();
    let (code, out) = result?;
    assert_eq!(code, 2, "a renewed Lease must not be judged free: {out}");
    assert!(out.contains("still held by skewed-replica_1234"), "{out}");
    assert!(
        leases.get_opt(&live).await?.is_some(),
        "the live Lease was deleted: {out}"
    );

    let abandoned = unique_name("gk-un-skewed-gone");
    skewed_lease(&c, &ns, &abandoned, Timestamp::now() + hour).await?;
    let started = std::time::Instant::now();
    let (code, out) = uninstall(&c, &ns, &abandoned, false).await?;
    assert_eq!(code, 0, "{out}");
    assert!(leases.get_opt(&abandoned).await?.is_none(), "{out}");
    assert!(
        started.elapsed() >= Duration::from_secs(15),
        "deleted after {:?}, before the hook saw it unchanged for its 15 s: {out}",
        started.elapsed()
    );
    println!(
        "abandoned Lease (renewTime 1 h ahead) deleted {:?} after the hook started",
        started.elapsed()
    );
    Ok(())
}

/// Gated pods are never stranded: uninstall takes groundskeeper's gate off every pod that still
/// carries it (nothing would place it once the release is gone), keeps every other gate, and
/// touches no pod without it; `--dry-run` only says so.
#[tokio::test]
async fn uninstall_releases_the_pods_the_gate_holds_and_nothing_else() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    let Some(c) =
        testkit::cluster("uninstall_releases_the_pods_the_gate_holds_and_nothing_else").await
    else {
        return Ok(());
    };
    let ns = c.namespace("gk-uninstall-gated").await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let gate = "groundskeeper.dev/sysctl";
    let pod = |name: &str, gates: &[&str]| -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": &ns},
            "spec": {
                "schedulingGates": gates.iter().map(|g| json!({"name": g})).collect::<Vec<_>>(),
                "containers": [{"name": "c", "image": "busybox"}],
            },
        }))?)
    };
    for (name, gates) in [
        ("ours", vec![gate]),
        (
            "ours-and-theirs",
            vec!["example.com/quota", gate, "example.com/later"],
        ),
        ("theirs", vec!["example.com/quota"]),
        ("none", vec![]),
    ] {
        pods.create(&Default::default(), &pod(name, &gates)?)
            .await?;
    }
    let gates_of = |p: &Pod| -> Vec<String> {
        p.spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|g| g.name)
            .collect()
    };
    let lease = unique_name("gk-no-lease");
    let (code, out) = uninstall(&c, &ns, &lease, true).await?;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "dry-run: would remove the scheduling gate {gate} from pod {ns}/ours\n"
        )),
        "{out}"
    );
    assert_eq!(
        gates_of(&pods.get("ours").await?),
        vec![gate],
        "dry-run changed a pod"
    );

    let (code, out) = uninstall(&c, &ns, &lease, false).await?;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "removed the scheduling gate {gate} from pod {ns}/ours"
        )),
        "{out}"
    );
    assert!(gates_of(&pods.get("ours").await?).is_empty());
    assert_eq!(
        gates_of(&pods.get("ours-and-theirs").await?),
        vec!["example.com/quota", "example.com/later"],
        "only groundskeeper's gate goes"
    );
    let theirs = pods.get("theirs").await?;
    assert_eq!(gates_of(&theirs), vec!["example.com/quota"]);
    assert!(!out.contains("/theirs") && !out.contains("/none"), "{out}");
    Ok(())
}

/// The hook's own rules, as the chart renders them, are enough: acting as a ServiceAccount bound
/// to exactly them, uninstall deletes the released Lease, takes the finalizer off a ServiceCIDR
/// and the gate off a pod (each read, judged and written as the hook does).
#[tokio::test]
async fn uninstall_needs_only_the_charts_rules() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    let test = "uninstall_needs_only_the_charts_rules";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let ns = c.namespace("gk-uninstall-rbac").await?;
    let lease_name = unique_name("gk-un-lease");
    let Some(docs) = testkit::chart::render_release(
        "gk",
        &[
            "-n",
            &ns,
            "--set",
            &format!("controllerManager.leaderElection.leaseName={lease_name}"),
            "--show-only",
            "templates/uninstall-hook.yaml",
        ],
    ) else {
        testkit::skipped(test, "helm not installed (run .ci/tools.sh)");
        return Ok(());
    };
    let rules = |kind: &str| testkit::chart::rules(&docs, kind, None);
    let kubeconfig = c
        .as_service_account_with(&ns, rules("ClusterRole"), rules("Role"))
        .await?;
    c.create(&Lease {
        metadata: ObjectMeta {
            name: Some(lease_name.clone()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec::default()),
    })
    .await?;
    let cidr = unique_name("gk-un-rbac");
    protected_cidr(&c, &cidr, &format!("10.208.{}.0/25", octet())).await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    pods.create(
        &Default::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "held", "namespace": &ns},
            "spec": {
                "schedulingGates": [{"name": "groundskeeper.dev/sysctl"}],
                "containers": [{"name": "c", "image": "busybox"}],
            },
        }))?,
    )
    .await?;
    let (code, out) = uninstall_as(&kubeconfig, &ns, &lease_name, false).await?;
    assert_eq!(code, 0, "{out}");
    let cidrs: Api<ServiceCIDR> = Api::all(c.client.clone());
    assert!(finalizers(&cidrs.get(&cidr).await?).is_empty(), "{out}");
    let held = pods.get("held").await?;
    assert!(
        held.spec
            .unwrap()
            .scheduling_gates
            .unwrap_or_default()
            .is_empty(),
        "{out}"
    );
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &ns);
    assert!(leases.get_opt(&lease_name).await?.is_none(), "{out}");
    Ok(())
}
