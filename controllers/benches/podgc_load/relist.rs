//! The relist row: a PodGC frozen through an apiserver restart after an etcd compaction, so
//! that its watches list everything again; its peak RSS across the relist and after it.

use std::time::{Duration, Instant};

use crate::process::{Run, apiserver_requests, kcm_bin, reset_peak};
use crate::start::{self, FirstPods};
use testkit::figures::{bench as figure, mib, status_kib};
use testkit::{Binary, http_get, wait_for, wait_ready};

/// A PodGC's memory around one forced relist of all its watches.
pub(crate) struct Relisted {
    pub(crate) steady_kib: u64,
    /// VmHWM before the reset: the first list's peak.
    pub(crate) first_peak_kib: u64,
    /// VmHWM from the freeze to the settled state after the relist.
    pub(crate) peak_kib: u64,
    pub(crate) after_kib: u64,
    /// From the resume until the relist was done.
    pub(crate) took: Duration,
}

impl Relisted {
    pub(crate) fn print(&self, who: &str, prefix: &str, size: &str) {
        println!(
            "relist row: {who}: RSS steady {:.1} MiB (first list's peak {:.1} MiB); \
             relisted {:.1}s after it resumed; peak across the relist {:.1} MiB, RSS after {:.1} MiB",
            mib(self.steady_kib),
            mib(self.first_peak_kib),
            self.took.as_secs_f64(),
            mib(self.peak_kib),
            mib(self.after_kib)
        );
        figure(
            &format!("{prefix}_rss_peak_relist_{size}"),
            mib(self.peak_kib),
            "MiB",
        );
        figure(
            &format!("{prefix}_rss_after_relist_{size}"),
            mib(self.after_kib),
            "MiB",
        );
        figure(
            &format!("{prefix}_relist_{size}_s"),
            self.took.as_secs_f64(),
            "s",
        );
    }
}

/// The relist row: see the module doc.
pub(crate) async fn relist_row(
    cluster: &testkit::Cluster,
    cp: Option<&testkit::ControlPlane>,
    bin: &str,
    size: &str,
) -> anyhow::Result<()> {
    let Some(cp) = cp else {
        println!(
            "relist row: SKIPPED (it restarts the apiserver: only on the bench's own control plane, KUBE_APISERVER)"
        );
        return Ok(());
    };
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let first_ns = cluster
        .namespace_for_pods("podgc-first", Duration::from_secs(60))
        .await?;
    let first = FirstPods::make(&cluster.client, &first_ns).await?;
    start::floor(&cluster.client, size).await?;
    start::floor_variants(&cluster.client, size).await?;
    let started = Instant::now();
    let run = Run::start(bin, &kubeconfig, &["--gc-period=5s", start::THRESHOLD_FLAG])?;
    let (listed, deleted) = tokio::join!(
        async {
            wait_ready(run.admin(), Duration::from_secs(900), "podgc ready").await?;
            anyhow::Ok(started.elapsed())
        },
        first.first_delete(started, Duration::from_secs(900)),
    );
    let (listed, deleted) = (listed?, deleted?);
    let ours_first = deleted.0;
    start::print_start("groundskeeper", "manager", size, Some(listed), deleted)?;
    if crate::process::only("start") {
        drop(run);
        return start::from_watch_cache(&cluster.client, size).await;
    }
    run.wait_cycles(2.0).await?;
    let ours = relist_ours(cluster, cp, &run).await;
    drop(run);
    ours?.print("groundskeeper", "manager", size);
    match kcm_bin() {
        Some(kcm) => {
            let first = FirstPods::make(&cluster.client, &first_ns).await?;
            let started = Instant::now();
            let k = Run::start_kcm(&kcm, &kubeconfig, 20, 30, &[start::THRESHOLD_FLAG])?;
            let (listed, deleted) = tokio::join!(
                async {
                    k.bin
                        .wait_for_log("Caches are synced", Duration::from_secs(900))
                        .await?;
                    anyhow::Ok(started.elapsed())
                },
                first.first_delete(started, Duration::from_secs(900)),
            );
            let deleted = deleted?;
            let kcm_first = deleted.0;
            start::print_start(
                "kube-controller-manager",
                "kcm",
                size,
                Some(listed?),
                deleted,
            )?;
            testkit::figures::bench(
                &format!("start_to_first_delete_ratio_to_kcm_{size}"),
                ours_first.as_secs_f64() / kcm_first.as_secs_f64(),
                "ratio",
            );
            // Two of its 20 s cycles, as in its steady row.
            tokio::time::sleep(Duration::from_secs(45)).await;
            let theirs = relist_kcm(cp, &k).await;
            drop(k);
            theirs?.print("kube-controller-manager", "kcm", size);
        }
        None => println!(
            "relist row: kube-controller-manager SKIPPED (set PODGC_BENCH_KCM, or run `bash e2e/cluster.sh binaries` once)"
        ),
    }
    start::from_watch_cache(&cluster.client, size).await
}

/// Freezes `bin` through an apiserver restart after an etcd compaction, its peak RSS reset
/// just before: what it reads of the freeze, and when it was resumed.
pub(crate) async fn freeze_through_compaction(
    cp: &testkit::ControlPlane,
    bin: &Binary,
) -> anyhow::Result<(u64, u64, Instant)> {
    let pid = bin.pid().expect("running");
    let (steady, first_peak) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    reset_peak(pid)?;
    // The restarted apiserver reads every pod back from etcd before it is ready.
    cp.set_ready_timeout(Duration::from_secs(900));
    let frozen = Instant::now();
    let resumed = cp
        .restart_while_frozen(bin, testkit::control_plane::Outage::FrozenThroughCompaction)
        .await?;
    println!(
        "relist row: frozen {:.1}s (etcd compacted, kube-apiserver restarted and ready)",
        (resumed - frozen).as_secs_f64()
    );
    Ok((steady, first_peak, resumed))
}

/// Ours: relisted once the pod watch has failed (until the resumed process notices, its
/// caches look current) and every watch is healthy again; proven by the failure in its log and
/// the apiserver's own count of pod LISTs since its restart.
pub(crate) async fn relist_ours(
    cluster: &testkit::Cluster,
    cp: &testkit::ControlPlane,
    run: &Run,
) -> anyhow::Result<Relisted> {
    let errors = "groundskeeper_watch_errors_total{watch=\"podgc/pods\"} ";
    let errors_before = run.metric(errors).await?;
    let log_before = run.bin.logs().len();
    let (steady_kib, first_peak_kib, resumed) = freeze_through_compaction(cp, &run.bin).await?;
    let no_relist = |what: &str| {
        let logs = run.bin.logs();
        anyhow::anyhow!(
            "relist row: NO RELIST: {what}; log since the freeze:\n{}",
            logs.get(log_before..).unwrap_or(&logs)
        )
    };
    wait_for(
        Duration::from_secs(120),
        "the pod watch to fail",
        || async { Ok(run.metric(errors).await? > errors_before) },
    )
    .await
    .map_err(|e| no_relist(&format!("{e:#}")))?;
    wait_for(
        Duration::from_secs(1800),
        "every watch relisted",
        || async {
            let (_, body) = http_get(run.admin(), "/metrics").await?;
            let stale: Vec<f64> = body
                .lines()
                .filter(|l| l.starts_with("groundskeeper_watch_stale_seconds{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
                .collect();
            Ok(!stale.is_empty() && stale.iter().all(|s| *s == 0.0))
        },
    )
    .await?;
    let took = resumed.elapsed();
    let logs = run.bin.logs();
    let since = logs.get(log_before..).unwrap_or(&logs);
    let failed: Vec<&str> = since
        .lines()
        .filter(|l| l.contains("watch=\"podgc/pods\"") && l.contains("watch failed"))
        .collect();
    for l in &failed {
        println!("  {l}");
    }
    // A silence is re-watched from the last resourceVersion, not relisted. A freeze longer than
    // --watch-silent-after (at 150k pods the restart alone takes minutes) fails the watch as
    // silent first; the 410 of its re-watch then relists without a second "watch failed"
    // line, so the apiserver's own count of LISTs below is the proof that always holds.
    let logged_relist = failed
        .iter()
        .any(|l| !l.contains("nothing from the server"));
    // Through a client whose pooled connection died with the old apiserver: a few tries.
    let mut lists = None;
    for _ in 0..5 {
        let labels = ["verb=\"LIST\"", "resource=\"pods\"", "scope=\"cluster\""];
        lists = apiserver_requests(&cluster.client, &labels).await;
        if lists.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    match lists {
        Some(n) if n > 0.0 => println!(
            "relist row: the restarted apiserver answered {n} cluster-wide pod LISTs (one a page)"
        ),
        Some(_) => return Err(no_relist("the restarted apiserver answered no pod LIST")),
        None if logged_relist => println!(
            "relist row: WARNING: the apiserver's /metrics not readable; relist proven by the log alone"
        ),
        None => {
            return Err(no_relist(
                "no failure of the pod watch that leads to a list, and the apiserver's count of LISTs not readable",
            ));
        }
    }
    let c0 = run.cycles().await?;
    run.wait_cycles(c0 + 2.0).await?;
    Ok(Relisted {
        steady_kib,
        first_peak_kib,
        peak_kib: run.proc_status("VmHWM:"),
        after_kib: run.proc_status("VmRSS:"),
        took,
    })
}

/// kube-controller-manager: relisted once its pod reflector logs `Caches populated` again.
pub(crate) async fn relist_kcm(cp: &testkit::ControlPlane, k: &Run) -> anyhow::Result<Relisted> {
    let populated = || {
        k.bin
            .logs()
            .lines()
            .filter(|l| l.contains("Caches populated") && l.contains("*v1.Pod"))
            .count()
    };
    let before = populated();
    anyhow::ensure!(
        before > 0,
        "relist row: kube-controller-manager never logged `Caches populated` for pods (-v=2): its relist could not be seen; log {}",
        k.bin.log_path().display()
    );
    let (steady_kib, first_peak_kib, resumed) = freeze_through_compaction(cp, &k.bin).await?;
    wait_for(
        Duration::from_secs(1800),
        "kube-controller-manager to list pods again",
        || async { Ok(populated() > before) },
    )
    .await
    .map_err(|e| anyhow::anyhow!("relist row: NO RELIST of kube-controller-manager: {e:#}"))?;
    let took = resumed.elapsed();
    tokio::time::sleep(Duration::from_secs(45)).await;
    Ok(Relisted {
        steady_kib,
        first_peak_kib,
        peak_kib: k.proc_status("VmHWM:"),
        after_kib: k.proc_status("VmRSS:"),
        took,
    })
}
