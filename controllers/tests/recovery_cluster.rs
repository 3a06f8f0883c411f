//! controller-manager through control-plane outages, against a private etcd + kube-apiserver:
//! `/readyz` goes 503 past `--watch-stale-after` while `/healthz` stays 200, and once the
//! apiserver is back both controllers act again within 5 s (PodGC deletes a new orphan pod,
//! the ServiceCIDR controller puts its finalizer on a new ServiceCIDR). Twice: a plain
//! apiserver crash and restart, then a restart after etcd was compacted (every resourceVersion
//! the manager knew is gone). And a watch whose connection stays up while nothing comes
//! through it (a frozen proxy): PodGC stops and `/readyz` goes 503 within
//! `--watch-silent-after`, and both come back once bytes flow again.

use std::time::{Duration, Instant};

use k8s_openapi::api::{
    core::v1::Pod,
    networking::v1::{ServiceCIDR, ServiceCIDRSpec},
};
use kube::{Api, ResourceExt, api::ObjectMeta};
use testkit::control_plane::Outage;
use testkit::{Binary, metric, proxy::Proxy, unique_name, wait_for, wait_ready};

const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";
const RECOVERY_BOUND: Duration = Duration::from_secs(5);
/// Longer than --watch-stale-after below, and long enough for the backoff to reach its cap.
const OUTAGE: Duration = Duration::from_secs(8);

#[tokio::test]
async fn controllers_act_within_5s_after_apiserver_outages() -> anyhow::Result<()> {
    let name = "controllers_act_within_5s_after_apiserver_outages";
    let Some((c, cp)) = testkit::private_cluster(name).await else {
        return Ok(());
    };
    let ns = c.namespace("recovery").await?;
    let kubeconfig = cp.kubeconfig.display().to_string();
    let (manager, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-recovery",
        &[
            "--leader-elect=false",
            "--controllers=servicecidr,podgc",
            "--gc-period=500ms",
            "--orphan-quarantine=0s",
            "--watch-stale-after=5s",
        ],
        &[("KUBECONFIG", &kubeconfig)],
    )?;
    wait_ready(admin, Duration::from_secs(30), "controller-manager ready").await?;
    manager
        .wait_for_log("podgc running", Duration::from_secs(30))
        .await?;

    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let cidrs: Api<ServiceCIDR> = Api::all(c.client.clone());
    let mut report = Vec::new();
    for (round, outage) in [
        Outage::Restart,
        Outage::RestartAfterCompaction,
        Outage::FrozenThroughCompaction,
    ]
    .into_iter()
    .enumerate()
    {
        let up = if let Outage::FrozenThroughCompaction = outage {
            cp.restart_while_frozen(&manager, outage).await?
        } else {
            cp.stop_apiserver();
            let down = Instant::now();
            cp.ride_out(outage, admin, down, OUTAGE).await?;
            assert!(
                manager.logs().contains("podgc cycle skipped"),
                "{outage:?}: PodGC cycles (every 500 ms) ran on stale caches during the outage"
            );
            cp.start_apiserver()?;
            Instant::now()
        };
        // New work for each controller, made as soon as the apiserver answers.
        let pod_name = format!("orphan-{round}");
        c.create(&testkit::bound_pod(
            &ns,
            &pod_name,
            &unique_name("gone-node"),
        ))
        .await?;
        let cidr_name = unique_name("recovery");
        let third = 100 + (std::process::id() % 40) as u8 + round as u8 * 40;
        c.create(&ServiceCIDR {
            metadata: ObjectMeta {
                name: Some(cidr_name.clone()),
                ..Default::default()
            },
            spec: Some(ServiceCIDRSpec {
                cidrs: Some(vec![format!("10.{third}.0.0/24")]),
            }),
            status: None,
        })
        .await?;

        let (orphan, finalizer) = tokio::join!(
            async {
                wait_for(RECOVERY_BOUND, "PodGC deletes the orphan pod", || async {
                    Ok(pods.get_opt(&pod_name).await?.is_none())
                })
                .await
                .map(|_| up.elapsed())
            },
            async {
                wait_for(
                    RECOVERY_BOUND,
                    "the ServiceCIDR controller adds its finalizer",
                    || async {
                        Ok(cidrs
                            .get_opt(&cidr_name)
                            .await?
                            .is_some_and(|o| o.finalizers().iter().any(|f| f == FINALIZER)))
                    },
                )
                .await
                .map(|_| up.elapsed())
            }
        );
        let (orphan, finalizer) = match (orphan, finalizer) {
            (Ok(o), Ok(f)) => (o, f),
            (o, f) => anyhow::bail!(
                "{outage:?}: podgc {o:?}, servicecidr {f:?}; log:\n{}",
                manager.logs()
            ),
        };
        wait_ready(admin, RECOVERY_BOUND, "/readyz 200 after the outage").await?;
        let ready = up.elapsed();
        println!(
            "RECOVERY controller-manager {outage:?}: apiserver ready -> orphan pod deleted in {:.2}s, ServiceCIDR finalizer in {:.2}s, /readyz 200 in {:.2}s",
            orphan.as_secs_f64(),
            finalizer.as_secs_f64(),
            ready.as_secs_f64()
        );
        if let Outage::FrozenThroughCompaction = outage {
            assert!(
                manager.logs().contains("too old resource version"),
                "{outage:?}: the resumed watches were expected to get 410 Gone; log:\n{}",
                manager.logs()
            );
        }
        report.push((outage, orphan, finalizer));
    }
    println!("{report:?}");
    drop(manager);
    drop(c);
    drop(cp);
    Ok(())
}

/// A silent apiserver must not look healthy, black-box: the manager reaches the apiserver through a proxy that stops
/// forwarding (connections stay open, nothing comes through: no event, no bookmark, no error).
/// Within `--watch-silent-after` (10 s) the watches count as failed: `/readyz` answers 503, the
/// error counter moves, and PodGC skips its cycles instead of deleting on caches that stopped
/// moving. When bytes flow again, it is ready and deleting within seconds.
#[tokio::test]
async fn a_watch_that_goes_silent_stops_podgc_and_readiness_until_it_recovers() -> anyhow::Result<()>
{
    let name = "a_watch_that_goes_silent_stops_podgc_and_readiness_until_it_recovers";
    let Some(c) = testkit::cluster(name).await else {
        return Ok(());
    };
    let Some(apiserver) = testkit::proxy::apiserver_addr(&c.kubeconfig)? else {
        testkit::skipped(name, "the kubeconfig names the apiserver by host name");
        return Ok(());
    };
    const SILENT_AFTER: Duration = Duration::from_secs(10);
    let ns = c.namespace("silent").await?;
    let proxy = Proxy::start(apiserver).await?;
    let via_proxy = testkit::proxy::kubeconfig_with_server(&c.kubeconfig, &proxy.url())?;
    let via_proxy = via_proxy.display().to_string();
    let (manager, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-silent",
        &[
            "--leader-elect=false",
            "--controllers=podgc",
            "--gc-period=500ms",
            "--orphan-quarantine=0s",
            "--watch-silent-after=10s",
            "--watch-stale-after=5s",
            "--kube-api-timeout=5s",
        ],
        &[("KUBECONFIG", &via_proxy)],
    )?;
    wait_ready(admin, Duration::from_secs(30), "controller-manager ready").await?;
    manager
        .wait_for_log("podgc running", Duration::from_secs(30))
        .await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let orphan = |name: &str| testkit::bound_pod(&ns, name, &unique_name("gone-node"));
    c.create(&orphan("before")).await?;
    wait_for(
        Duration::from_secs(10),
        "PodGC to delete an orphan",
        || async { Ok(pods.get_opt("before").await?.is_none()) },
    )
    .await?;
    // Quiet watches stay healthy: their bookmarks keep them alive past the bound.
    tokio::time::sleep(SILENT_AFTER + Duration::from_secs(2)).await;
    let errors = r#"groundskeeper_watch_errors_total{watch="podgc/nodes"}"#;
    assert_eq!(
        metric(admin, errors).await?,
        Some(0.0),
        "a quiet watch was failed"
    );

    proxy.freeze();
    let frozen = Instant::now();
    wait_for(
        SILENT_AFTER + Duration::from_secs(3),
        "/readyz 503 once the watches are silent past the bound",
        || async { Ok(testkit::status(admin, "/readyz").await == 503) },
    )
    .await?;
    let not_ready = frozen.elapsed();
    // Each watch is failed at its own bound (the first one turns /readyz 503).
    wait_for(
        Duration::from_secs(3),
        "the silence counted as a watch error",
        || async { Ok(metric(admin, errors).await?.unwrap_or_default() >= 1.0) },
    )
    .await?;
    // An orphan the frozen caches do not see; and PodGC says it deletes nothing meanwhile.
    c.create(&orphan("during")).await?;
    manager
        .wait_for_log("podgc cycle skipped", Duration::from_secs(5))
        .await?;
    let logs = manager.logs();
    assert!(logs.contains("nothing from the server for"), "log:\n{logs}");

    proxy.resume();
    let resumed = Instant::now();
    wait_ready(
        admin,
        Duration::from_secs(30),
        "/readyz 200 after the proxy resumed",
    )
    .await?;
    let ready = resumed.elapsed();
    wait_for(
        Duration::from_secs(30),
        "PodGC to delete the orphan made meanwhile",
        || async { Ok(pods.get_opt("during").await?.is_none()) },
    )
    .await?;
    println!(
        "SILENT WATCH: /readyz 503 {:.1}s after the freeze (bound {SILENT_AFTER:?}); ready {:.1}s and orphan deleted {:.1}s after the resume",
        not_ready.as_secs_f64(),
        ready.as_secs_f64(),
        resumed.elapsed().as_secs_f64()
    );
    drop(manager);
    Ok(())
}
