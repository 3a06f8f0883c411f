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
        .env("KUBECONFIG", &c.kubeconfig)
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
