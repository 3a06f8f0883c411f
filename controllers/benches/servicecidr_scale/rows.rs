//! The rows: a controller (ours, an older build of ours, or kube-controller-manager's) started
//! on the objects, its RSS once its caches are full, and the time to its decision on a covered
//! and on a blocked ServiceCIDR deletion, each printed as `bench` lines.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::objects::{FINALIZER, GRACE};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, WatchEvent, WatchParams},
};
use testkit::figures::{bench, mib, status_kib};
use testkit::networking::{self};
use testkit::{Binary, http_get, wait_for, wait_ready};

pub(crate) fn is_ready(o: &ServiceCIDR) -> bool {
    o.finalizers().iter().any(|f| f == FINALIZER)
        && ready_condition(o).is_some_and(|c| c.0 == "True")
}

pub(crate) fn ready_condition(o: &ServiceCIDR) -> Option<(String, String)> {
    networking::ready_condition(o).map(|c| (c.status.clone(), c.reason.clone()))
}

pub(crate) async fn all_ready(api: &Api<ServiceCIDR>, want: usize) -> anyhow::Result<bool> {
    let l = api.list(&ListParams::default()).await?;
    Ok(l.items.iter().filter(|o| is_ready(o)).count() >= want)
}

/// A controller-manager binary (this build's unless `bin` names another), the ServiceCIDR
/// controller alone.
pub(crate) fn ours(
    kubeconfig: &Path,
    bin: Option<&str>,
    extra: &[&str],
) -> anyhow::Result<(Binary, SocketAddr)> {
    let mut args = vec!["--leader-elect=false", "--controllers", "servicecidr"];
    args.extend_from_slice(extra);
    let bin = bin.unwrap_or(env!("CARGO_BIN_EXE_controller-manager"));
    let kubeconfig = kubeconfig.display().to_string();
    Binary::start_with_admin(
        bin,
        "servicecidr-scale",
        &args,
        &[("KUBECONFIG", &kubeconfig)],
    )
}

pub(crate) async fn metric_sum(admin: SocketAddr, prefix: &str) -> f64 {
    let body = http_get(admin, "/metrics")
        .await
        .map(|(_, b)| b)
        .unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// (count, sum) of this build's sync-duration histogram.
pub(crate) async fn syncs(admin: SocketAddr) -> (f64, f64) {
    (
        metric_sum(
            admin,
            "groundskeeper_servicecidr_reconcile_duration_seconds_count",
        )
        .await,
        metric_sum(
            admin,
            "groundskeeper_servicecidr_reconcile_duration_seconds_sum",
        )
        .await,
    )
}

/// What the bench's watch saw after a DELETE: `Some(dur)` when `done` held that long after it.
pub(crate) async fn delete_and_watch(
    client: &Client,
    name: &str,
    within: Duration,
    done: impl Fn(&WatchEvent<ServiceCIDR>) -> bool,
) -> anyhow::Result<(Option<Duration>, jiff::Timestamp, Option<jiff::Timestamp>)> {
    let api: Api<ServiceCIDR> = Api::all(client.clone());
    let rv = api
        .get(name)
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(within.as_secs().max(1) as u32 + 5);
    let mut events = api.watch(&wp, &rv).await?.boxed();
    let t0 = Instant::now();
    let deleted = api.delete(name, &DeleteParams::default()).await?;
    let deletion_ts = deleted
        .left()
        .and_then(|o| o.metadata.deletion_timestamp)
        .map(|t| t.0)
        .ok_or_else(|| anyhow::anyhow!("{name} was not held by a finalizer"))?;
    let seen = tokio::time::timeout(within, async {
        while let Some(ev) = events.try_next().await? {
            if done(&ev) {
                return anyhow::Ok(Some((t0.elapsed(), jiff::Timestamp::now())));
            }
        }
        anyhow::Ok(None)
    })
    .await
    .unwrap_or(Ok(None))?;
    Ok((seen.map(|s| s.0), deletion_ts, seen.map(|s| s.1)))
}

/// The figures of one controller's run.
pub(crate) struct Row {
    steady_kib: u64,
    peak_kib: u64,
    listed: Duration,
    covered_ms: Option<f64>,
    blocked_ms: Option<f64>,
}

/// Both deletions on a running controller: `covered` (its IPs are in the parent too) and
/// `blocked` (its IPv4 ones are in no other).
pub(crate) async fn deletions(
    client: &Client,
    covered: &str,
    blocked: &str,
) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    // (a): gone past the grace period; how long past the timestamp's 10 s.
    let (_, deletion_ts, gone_at) =
        delete_and_watch(client, covered, Duration::from_secs(40), |ev| {
            matches!(ev, WatchEvent::Deleted(_))
        })
        .await?;
    // The wall clock when the watch saw it gone, against deletionTimestamp + 10 s.
    let covered_ms = gone_at
        .map(|at| (at.duration_since(deletion_ts).as_secs_f64() - GRACE.as_secs_f64()) * 1e3);
    // (b): Ready=False/Terminating.
    let (terminating, _, _) = delete_and_watch(client, blocked, Duration::from_secs(40), |ev| {
        matches!(ev, WatchEvent::Modified(o) if ready_condition(o)
            == Some(("False".into(), "Terminating".into())))
    })
    .await?;
    let blocked_ms = terminating.map(|d| d.as_secs_f64() * 1e3);
    Ok((covered_ms, blocked_ms))
}

pub(crate) fn kcm_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("SERVICECIDR_SCALE_KCM") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/bin/kube-controller-manager");
    p.is_file().then_some(p)
}

pub(crate) async fn our_row(
    c: &testkit::Cluster,
    bin: Option<&str>,
    tag: &str,
    n_cidrs: usize,
    covered: &str,
    blocked: &str,
) -> anyhow::Result<Row> {
    let t0 = Instant::now();
    let (bin, admin) = ours(&c.kubeconfig, bin, &[])?;
    let pid = bin.pid().expect("running");
    wait_ready(admin, Duration::from_secs(600), "controller-manager ready").await?;
    let listed = t0.elapsed();
    // Steady: every ServiceCIDR synced once since the start, then a few quiet seconds.
    wait_for(
        Duration::from_secs(300),
        "a sync of every ServiceCIDR",
        || async { Ok(syncs(admin).await.0 >= n_cidrs as f64) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let steady_kib = status_kib(pid, "VmRSS:");
    let (n0, s0) = syncs(admin).await;
    let (covered_ms, blocked_ms) = deletions(&c.client, covered, blocked).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (n1, s1) = syncs(admin).await;
    if n1 > n0 {
        let mean = (s1 - s0) / (n1 - n0) * 1e3;
        println!(
            "groundskeeper: {} syncs during the two deletions, {mean:.2} ms each on average (its reconcile_duration histogram, API calls included)",
            n1 - n0
        );
        bench(
            &format!("{tag}servicecidr_sync_ms_mean_deletions"),
            mean,
            "ms",
        );
    }
    let peak_kib = status_kib(pid, "VmHWM:");
    drop(bin);
    Ok(Row {
        steady_kib,
        peak_kib,
        listed,
        covered_ms,
        blocked_ms,
    })
}

pub(crate) async fn kcm_row(
    c: &testkit::Cluster,
    bin: &PathBuf,
    covered: &str,
    blocked: &str,
) -> anyhow::Result<Row> {
    let log =
        std::env::temp_dir().join(format!("kcm-servicecidr-scale-{}.log", std::process::id()));
    let file = std::fs::File::create(&log)?;
    let kubeconfig = c.kubeconfig.display().to_string();
    let t0 = Instant::now();
    let mut child = tokio::process::Command::new(bin)
        .args([
            "--kubeconfig",
            &kubeconfig,
            "--controllers=service-cidr-controller",
            "--leader-elect=false",
            "--secure-port=0",
            "--v=2",
        ])
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().expect("kube-controller-manager runs");
    println!("kube-controller-manager: pid {pid}, log {}", log.display());
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    // Its informers log when they have listed; a minute stands for that if the line changed.
    while !(logs().contains("Caches are synced") && logs().contains("service-cidr"))
        && t0.elapsed() < Duration::from_secs(60)
    {
        anyhow::ensure!(
            status_kib(pid, "VmRSS:") > 0,
            "kube-controller-manager exited; log {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed = t0.elapsed();
    // Upstream exports no metric of its own for it: a quiet period stands for "synced once".
    tokio::time::sleep(Duration::from_secs(15)).await;
    anyhow::ensure!(
        status_kib(pid, "VmRSS:") > 0,
        "kube-controller-manager exited; log {}",
        log.display()
    );
    let steady_kib = status_kib(pid, "VmRSS:");
    let (covered_ms, blocked_ms) = deletions(&c.client, covered, blocked).await?;
    let peak_kib = status_kib(pid, "VmHWM:");
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(Row {
        steady_kib,
        peak_kib,
        listed,
        covered_ms,
        blocked_ms,
    })
}

pub(crate) fn print_row(who: &str, prefix: &str, tag: &str, r: &Row) {
    println!(
        "{who}: caches listed {:.1} s after start; RSS steady {:.1} MiB, peak {:.1} MiB",
        r.listed.as_secs_f64(),
        mib(r.steady_kib),
        mib(r.peak_kib)
    );
    let fmt =
        |v: Option<f64>| v.map_or("not seen within 40 s".to_string(), |v| format!("{v:.0} ms"));
    println!(
        "{who}: (a) covered ServiceCIDR gone {} after deletionTimestamp + 10 s; (b) blocked one Ready=False/Terminating {} after the DELETE",
        fmt(r.covered_ms),
        fmt(r.blocked_ms)
    );
    bench(
        &format!("{prefix}servicecidr_rss_{tag}"),
        mib(r.steady_kib),
        "MiB",
    );
    bench(
        &format!("{prefix}servicecidr_rss_peak_{tag}"),
        mib(r.peak_kib),
        "MiB",
    );
    bench(
        &format!("{prefix}servicecidr_listed_{tag}"),
        r.listed.as_secs_f64(),
        "s",
    );
    if let Some(v) = r.covered_ms {
        bench(
            &format!("{prefix}servicecidr_delete_decision_ms_{tag}"),
            v,
            "ms",
        );
    }
    if let Some(v) = r.blocked_ms {
        bench(
            &format!("{prefix}servicecidr_blocked_decision_ms_{tag}"),
            v,
            "ms",
        );
    }
}
