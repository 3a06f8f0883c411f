//! The ServiceCIDR controller against a real apiserver (kube-controller-manager runs there
//! without its own service-cidr-controller): finalizer and Ready, a deletion blocked by an
//! allocated Service IP and the event naming it, the 10 s grace, a covering parent, dry-run.
//!
//! The tests share one cluster-wide resource kind, so they run one at a time (SERIAL).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::{
    core::v1::{Event, Service, ServicePort, ServiceSpec},
    networking::v1::{IPAddress, ServiceCIDR},
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams},
};
use testkit::{
    Binary, Cluster, holds_for, metric,
    networking::{LABEL_FAMILY, LABEL_MANAGED_BY, ip_address, service_cidr},
    unique_name, wait_for,
};

const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";
const TERMINATING_MESSAGE: &str = "There are still IPAddresses referencing the ServiceCIDR, please remove them or create a new ServiceCIDR";

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A per-test octet so parallel runs and leftovers of failed runs do not overlap.
fn octet() -> u8 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    ((std::process::id() + N.fetch_add(1, Ordering::Relaxed) * 7 + nanos / 1000) % 250) as u8 + 1
}

fn controller(extra: &[&str]) -> (Binary, std::net::SocketAddr) {
    let mut args = vec!["--leader-elect=false", "--controllers", "servicecidr"];
    args.extend_from_slice(extra);
    Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-servicecidr",
        &args,
        &[],
    )
    .expect("start controller-manager")
}

async fn create_cidr(c: &Cluster, name: &str, cidrs: &[String]) -> anyhow::Result<ServiceCIDR> {
    c.create(&service_cidr(name, cidrs)).await
}

/// A new ServiceCIDR, uniquely named from `prefix`, once the controller has marked it Ready.
async fn ready_cidr(c: &Cluster, prefix: &str, cidrs: &[String]) -> anyhow::Result<String> {
    let name = unique_name(prefix);
    create_cidr(c, &name, cidrs).await?;
    wait_ready(c, &name).await?;
    Ok(name)
}

async fn get_cidr(c: &Cluster, name: &str) -> anyhow::Result<Option<ServiceCIDR>> {
    Ok(Api::<ServiceCIDR>::all(c.client.clone())
        .get_opt(name)
        .await?)
}

fn ready(o: &ServiceCIDR) -> Option<(String, String, String)> {
    testkit::networking::ready_condition(o)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_ready(c: &Cluster, name: &str) -> anyhow::Result<()> {
    wait_for(
        Duration::from_secs(20),
        &format!("finalizer and Ready=True on {name}"),
        || async {
            let Some(o) = get_cidr(c, name).await? else {
                return Ok(false);
            };
            Ok(o.finalizers().iter().any(|f| f == FINALIZER)
                && ready(&o)
                    == Some((
                        "True".into(),
                        String::new(),
                        "Kubernetes Service CIDR is ready".into(),
                    )))
        },
    )
    .await?;
    Ok(())
}

async fn delete_cidr(c: &Cluster, name: &str) -> anyhow::Result<Timestamp> {
    let api = Api::<ServiceCIDR>::all(c.client.clone());
    api.delete(name, &DeleteParams::default()).await?;
    let o = api.get(name).await?;
    Ok(o.metadata
        .deletion_timestamp
        .expect("held by the finalizer")
        .0)
}

/// Waits for the ServiceCIDR to be gone; returns when that was seen.
async fn wait_gone(c: &Cluster, name: &str, timeout: Duration) -> anyhow::Result<Timestamp> {
    wait_for(
        timeout,
        &format!("ServiceCIDR {name} to be gone"),
        || async { Ok(get_cidr(c, name).await?.is_none()) },
    )
    .await?;
    Ok(Timestamp::now())
}

/// Deletes the ServiceCIDR and waits for it to be gone, which must take the 10 s grace at least;
/// returns how long after its deletionTimestamp it went.
async fn gone_after_grace(c: &Cluster, name: &str) -> anyhow::Result<jiff::SignedDuration> {
    let deleted_at = delete_cidr(c, name).await?;
    let gone = wait_gone(c, name, Duration::from_secs(30)).await?;
    let after = gone.duration_since(deleted_at);
    assert!(
        after >= jiff::SignedDuration::from_secs(10),
        "{name} gone at {gone}, deleted at {deleted_at}"
    );
    Ok(after)
}

async fn service_with_ip(c: &Cluster, ns: &str, name: &str, ip: &str) -> anyhow::Result<Service> {
    c.create(&Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some(ip.into()),
            cluster_ips: Some(vec![ip.into()]),
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
}

async fn wait_ip(c: &Cluster, ip: &str) -> anyhow::Result<()> {
    wait_for(
        Duration::from_secs(10),
        &format!("IPAddress {ip}"),
        || async {
            let o = Api::<IPAddress>::all(c.client.clone()).get_opt(ip).await?;
            Ok(o.is_some_and(|o| {
                o.labels()
                    .get("ipaddress.kubernetes.io/managed-by")
                    .map(String::as_str)
                    == Some("ipallocator.k8s.io")
            }))
        },
    )
    .await?;
    Ok(())
}

/// Read as `kubectl get events` reads them: core/v1 Events, selected by the reporting
/// controller's name (events.k8s.io/v1 refuses a `deprecatedSource` on create, so `source`
/// stays empty, as for every events.k8s.io recorder).
async fn blocked_event(c: &Cluster, cidr: &str) -> anyhow::Result<Option<String>> {
    let events: Api<Event> = Api::namespaced(c.client.clone(), "default");
    let by_source = ListParams::default().fields(&format!(
        "reportingComponent=groundskeeper.dev/servicecidr,reason=ServiceCIDRDeletionBlocked,involvedObject.name={cidr}"
    ));
    Ok(events
        .list(&by_source)
        .await?
        .items
        .into_iter()
        .find_map(|e| e.message))
}

#[tokio::test]
async fn blocked_by_service_ip_until_it_is_freed() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("blocked_by_service_ip_until_it_is_freed").await else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let (bin, admin) = controller(&[]);
    let x = octet();
    let cidrs = vec![format!("10.200.{x}.0/24"), format!("fd00:{x:x}::/112")];
    let name = ready_cidr(&c, "gk-scidr", &cidrs).await?;

    let ns = c.namespace("scidr").await?;
    let ip = format!("10.200.{x}.10");
    service_with_ip(&c, &ns, "web", &ip).await?;
    wait_ip(&c, &ip).await?;

    let deleted_at = delete_cidr(&c, &name).await?;
    wait_for(
        Duration::from_secs(10),
        "Ready=False/Terminating",
        || async {
            let o = get_cidr(&c, &name).await?;
            Ok(o.and_then(|o| ready(&o))
                == Some((
                    "False".into(),
                    "Terminating".into(),
                    TERMINATING_MESSAGE.into(),
                )))
        },
    )
    .await?;
    wait_for(Duration::from_secs(10), "the blocked event", || async {
        Ok(blocked_event(&c, &name).await?.is_some())
    })
    .await?;
    let note = blocked_event(&c, &name).await?.unwrap();
    assert!(note.contains(&ip), "{note}");
    assert!(note.contains(&format!("services {ns}/web")), "{note}");
    assert!(
        metric(admin, "groundskeeper_servicecidr_blocked_deletions")
            .await?
            .unwrap_or(0.0)
            >= 1.0
    );

    // What must not happen: past the grace period the finalizer stays while the IP exists.
    holds_for(
        Duration::from_secs(12),
        "finalizer kept while the IP exists",
        || async {
            Ok(get_cidr(&c, &name)
                .await?
                .is_some_and(|o| o.finalizers().iter().any(|f| f == FINALIZER)))
        },
    )
    .await?;

    Api::<Service>::namespaced(c.client.clone(), &ns)
        .delete("web", &DeleteParams::default())
        .await?;
    let gone = wait_gone(&c, &name, Duration::from_secs(30)).await?;
    assert!(
        gone.duration_since(deleted_at) >= jiff::SignedDuration::from_secs(10),
        "gone at {gone}, deleted at {deleted_at}"
    );
    bin.wait_for_log("removed finalizer", Duration::from_secs(5))
        .await?;
    Ok(())
}

#[tokio::test]
async fn unblocked_deletion_waits_the_grace_period() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("unblocked_deletion_waits_the_grace_period").await else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let (_bin, _) = controller(&[]);
    let x = octet();
    let name = ready_cidr(&c, "gk-scidr", &[format!("fd00:{x:x}::/112")]).await?;
    let after = gone_after_grace(&c, &name).await?;
    println!("gone {after:?} after deletionTimestamp");
    Ok(())
}

#[tokio::test]
async fn covering_parent_lets_deletion_proceed_despite_ips() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("covering_parent_lets_deletion_proceed_despite_ips").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let (_bin, _) = controller(&[]);
    let x = octet();
    let parent = unique_name("gk-scidr-parent");
    let child = unique_name("gk-scidr-child");
    create_cidr(&c, &parent, &[format!("10.201.{x}.0/24")]).await?;
    create_cidr(&c, &child, &[format!("10.201.{x}.128/25")]).await?;
    wait_ready(&c, &parent).await?;
    wait_ready(&c, &child).await?;
    let ns = c.namespace("scidr").await?;
    let ip = format!("10.201.{x}.200");
    service_with_ip(&c, &ns, "api", &ip).await?;
    wait_ip(&c, &ip).await?;

    gone_after_grace(&c, &child).await?;
    assert!(
        Api::<IPAddress>::all(c.client.clone())
            .get_opt(&ip)
            .await?
            .is_some(),
        "the IP stays, now only in the parent"
    );
    // The parent alone does hold the IP: its deletion is blocked.
    delete_cidr(&c, &parent).await?;
    wait_for(Duration::from_secs(10), "parent blocked", || async {
        Ok(get_cidr(&c, &parent)
            .await?
            .and_then(|o| ready(&o))
            .map(|r| r.1)
            == Some("Terminating".into()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn dry_run_logs_the_removal_and_keeps_the_finalizer() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("dry_run_logs_the_removal_and_keeps_the_finalizer").await else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let (bin, _) = controller(&["--dry-run"]);
    let x = octet();
    let name = unique_name("gk-scidr-dry");
    create_cidr(&c, &name, &[format!("10.202.{x}.0/24")]).await?;
    bin.wait_for_log(&name, Duration::from_secs(20)).await?;
    // Dry-run adds nothing itself; put the finalizer on as the real controller would have.
    Api::<ServiceCIDR>::all(c.client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(serde_json::json!({"metadata": {"finalizers": [FINALIZER]}})),
        )
        .await?;
    delete_cidr(&c, &name).await?;
    bin.wait_for_log("dry-run: would remove finalizer", Duration::from_secs(30))
        .await?;
    holds_for(
        Duration::from_secs(3),
        "finalizer kept under --dry-run",
        || async {
            Ok(get_cidr(&c, &name).await?.is_some_and(|o| {
                o.finalizers().iter().any(|f| f == FINALIZER) && ready(&o).is_none()
            }))
        },
    )
    .await?;
    let logs = bin.logs();
    assert!(logs.contains("would apply Ready condition"), "{logs}");
    assert!(!logs.contains("removed finalizer"), "{logs}");
    Ok(())
}

/// Dry-run writes nothing, Events included: a blocked deletion is logged, never recorded.
#[tokio::test]
async fn dry_run_records_no_event_for_a_blocked_deletion() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("dry_run_records_no_event_for_a_blocked_deletion").await else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let (bin, _) = controller(&["--dry-run"]);
    let x = octet();
    let name = unique_name("gk-scidr-dry-ev");
    create_cidr(&c, &name, &[format!("10.203.{x}.0/24")]).await?;
    Api::<ServiceCIDR>::all(c.client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(serde_json::json!({"metadata": {"finalizers": [FINALIZER]}})),
        )
        .await?;
    let ns = c.namespace("scidr-dry").await?;
    let ip = format!("10.203.{x}.10");
    service_with_ip(&c, &ns, "web", &ip).await?;
    wait_ip(&c, &ip).await?;
    delete_cidr(&c, &name).await?;
    bin.wait_for_log("dry-run: would record event", Duration::from_secs(20))
        .await?;
    holds_for(
        Duration::from_secs(3),
        "no ServiceCIDRDeletionBlocked event under --dry-run",
        || async { Ok(blocked_event(&c, &name).await?.is_none()) },
    )
    .await?;
    Ok(())
}

/// kube-controller-manager's controller adds the finalizer with a plain patch, so the apiserver
/// records it under the manager `kube-controller-manager`; creating the object with the
/// finalizer under that manager name leaves the same trace.
#[tokio::test]
async fn finalizer_written_by_kube_controller_manager_is_reported() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("finalizer_written_by_kube_controller_manager_is_reported").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let (bin, admin) = controller(&[]);
    wait_for(
        Duration::from_secs(10),
        "the controller's metrics",
        || async {
            Ok(metric(
                admin,
                "groundskeeper_servicecidr_conflicting_controller_detected",
            )
            .await?
            .is_some())
        },
    )
    .await?;
    assert_eq!(
        metric(
            admin,
            "groundskeeper_servicecidr_conflicting_controller_detected"
        )
        .await?,
        Some(0.0),
        "nothing foreign before: {}",
        bin.logs()
    );
    let x = octet();
    let name = unique_name("gk-scidr-kcm");
    let mut obj = service_cidr(&name, [format!("10.204.{x}.0/24")]);
    obj.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let created = Api::<ServiceCIDR>::all(c.client.clone())
        .create(
            &kube::api::PostParams {
                field_manager: Some("kube-controller-manager".into()),
                ..Default::default()
            },
            &obj,
        )
        .await?;
    c.track(&created);
    wait_ready(&c, &name).await?;
    wait_for(Duration::from_secs(10), "the conflict gauge", || async {
        Ok(metric(
            admin,
            "groundskeeper_servicecidr_conflicting_controller_detected",
        )
        .await?
            == Some(1.0))
    })
    .await?;
    bin.wait_for_log("another ServiceCIDR controller", Duration::from_secs(5))
        .await?;
    Ok(())
}

async fn ip_object(c: &Cluster, ip: &str, managed_by: Option<&str>) -> anyhow::Result<()> {
    let family = (LABEL_FAMILY, "IPv4");
    let labels: &[(&str, &str)] = match &managed_by {
        Some(m) => &[family, (LABEL_MANAGED_BY, m)],
        None => &[family],
    };
    c.create(&ip_address(ip, labels, "default", "not-there"))
        .await?;
    Ok(())
}

/// Network and broadcast addresses and IPAddresses the allocator does not manage never block.
#[tokio::test]
async fn network_broadcast_and_unmanaged_ips_do_not_block() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("network_broadcast_and_unmanaged_ips_do_not_block").await else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let (_bin, _) = controller(&[]);
    let x = octet();
    let name = ready_cidr(&c, "gk-scidr", &[format!("10.205.{x}.0/24")]).await?;
    ip_object(&c, &format!("10.205.{x}.0"), Some("ipallocator.k8s.io")).await?;
    ip_object(&c, &format!("10.205.{x}.255"), Some("ipallocator.k8s.io")).await?;
    ip_object(&c, &format!("10.205.{x}.7"), None).await?;
    ip_object(&c, &format!("10.205.{x}.8"), Some("someone-else")).await?;
    gone_after_grace(&c, &name).await?;
    assert!(blocked_event(&c, &name).await?.is_none());
    // They were there all along (nothing else removed them first).
    let ips = Api::<IPAddress>::all(c.client.clone());
    for host in [0, 255] {
        let ip = format!("10.205.{x}.{host}");
        assert!(ips.get_opt(&ip).await?.is_some(), "{ip} still exists");
    }
    Ok(())
}

/// Two equal ServiceCIDRs deleted at once while a Service holds an IP of theirs: neither is a
/// parent of the other once both are being deleted, so both wait until the IP is freed.
#[tokio::test]
async fn overlapping_cidrs_deleted_together_both_wait_for_the_ip() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("overlapping_cidrs_deleted_together_both_wait_for_the_ip").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let (_bin, _) = controller(&[]);
    let x = octet();
    let range = vec![format!("10.208.{x}.0/24")];
    let a = ready_cidr(&c, "gk-scidr-a", &range).await?;
    let b = ready_cidr(&c, "gk-scidr-b", &range).await?;
    let ns = c.namespace("scidr").await?;
    let ip = format!("10.208.{x}.10");
    service_with_ip(&c, &ns, "web", &ip).await?;
    wait_ip(&c, &ip).await?;

    let api = Api::<ServiceCIDR>::all(c.client.clone());
    let dp = DeleteParams::default();
    let (da, db) = tokio::join!(api.delete(&a, &dp), api.delete(&b, &dp));
    da?;
    db?;
    for name in [&a, &b] {
        wait_for(
            Duration::from_secs(10),
            &format!("{name} Ready=False/Terminating"),
            || async {
                Ok(get_cidr(&c, name)
                    .await?
                    .and_then(|o| ready(&o))
                    .map(|r| r.1)
                    == Some("Terminating".into()))
            },
        )
        .await?;
    }
    // What must not happen: past the grace period, either finalizer released while the IP
    // lies in no other ServiceCIDR.
    holds_for(
        Duration::from_secs(12),
        "both finalizers kept while the IP exists",
        || async {
            for name in [&a, &b] {
                let kept = get_cidr(&c, name)
                    .await?
                    .is_some_and(|o| o.finalizers().iter().any(|f| f == FINALIZER));
                if !kept {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await?;

    Api::<Service>::namespaced(c.client.clone(), &ns)
        .delete("web", &DeleteParams::default())
        .await?;
    wait_gone(&c, &a, Duration::from_secs(30)).await?;
    wait_gone(&c, &b, Duration::from_secs(30)).await?;
    Ok(())
}

/// A ServiceCIDR made dual-stack (`spec.cidrs` may grow by the other family) comes to cover the
/// IPv6 range of one whose deletion an IP there blocks: its update re-checks the blocked one,
/// whose deletion then finishes with no other event.
#[tokio::test]
async fn a_servicecidr_made_dual_stack_unblocks_the_deletion_it_now_covers() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("a_servicecidr_made_dual_stack_unblocks_the_deletion_it_now_covers").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let (_bin, _) = controller(&[]);
    let x = octet();
    let (v4, v6) = (format!("10.209.{x}.0/24"), format!("fd00:209:{x:x}::/112"));
    let blocked = ready_cidr(&c, "gk-scidr-blocked", &[v4.clone(), v6]).await?;
    let wide = ready_cidr(&c, "gk-scidr-wide", std::slice::from_ref(&v4)).await?;
    let ip = format!("fd00:209:{x:x}::10");
    c.create(&ip_address(
        &ip,
        &[
            (LABEL_FAMILY, "IPv6"),
            (LABEL_MANAGED_BY, "ipallocator.k8s.io"),
        ],
        "default",
        "not-there",
    ))
    .await?;
    delete_cidr(&c, &blocked).await?;
    wait_for(Duration::from_secs(10), "blocked", || async {
        Ok(get_cidr(&c, &blocked)
            .await?
            .and_then(|o| ready(&o))
            .map(|r| r.1)
            == Some("Terminating".into()))
    })
    .await?;
    // Past the grace period: nothing is due for it any more.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(get_cidr(&c, &blocked).await?.is_some(), "still blocked");

    let widened = serde_json::json!({"spec": {"cidrs": [v4, format!("fd00:209:{x:x}::/64")]}});
    Api::<ServiceCIDR>::all(c.client.clone())
        .patch(&wide, &PatchParams::default(), &Patch::Merge(widened))
        .await?;
    wait_gone(&c, &blocked, Duration::from_secs(10)).await?;
    Api::<IPAddress>::all(c.client.clone())
        .delete(&ip, &DeleteParams::default())
        .await?;
    Ok(())
}
