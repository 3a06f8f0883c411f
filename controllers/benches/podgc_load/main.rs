//! PodGC under load on a real apiserver: creates N pods of about 4 KB each bound to M nodes,
//! runs controller-manager (PodGC only) and prints its RSS once the caches are full, the CPU
//! time of one cycle, and the orphan force-delete rate at the default and a large QPS budget,
//! each beside kube-controller-manager v1.36.2's PodGC on the same apiserver and objects.
//!
//!   KUBE_APISERVER=path/to/kube-apiserver cargo bench -p groundskeeper-controllers --bench podgc_load
//!
//! At the default size it holds etcd, the apiserver and several GiB for 10 to 20 minutes: run it
//! alone on the machine. Measured figures and their commands: docs/benchmarks.md.
//!
//! With `KUBE_APISERVER` the bench starts its own throwaway control plane (testkit), its etcd
//! with `--quota-backend-bytes` PODGC_BENCH_ETCD_QUOTA_GIB (8) GiB, compacted and defragmented
//! between rows, and thrown away at the end (no cleanup of 150k pods). With `KUBECONFIG` it uses
//! that cluster and deletes what it made. With neither it prints one SKIPPED line and exits 0.
//!
//! Knobs (env): PODGC_BENCH_PODS (150000), PODGC_BENCH_NODES (15000), PODGC_BENCH_ORPHAN_NODES_SLOW
//! (orphaned nodes per PodGC for the QPS 20 rows, 60), PODGC_BENCH_ORPHAN_NODES_FAST (300),
//! PODGC_BENCH_FAST_QPS (1000), PODGC_BENCH_CREATE_CONCURRENCY (96), PODGC_BENCH_BIN (binary to
//! run; default: this build's), PODGC_BENCH_KCM (kube-controller-manager; default
//! target/e2e/bin/kube-controller-manager, which `e2e/cluster.sh binaries` unpacks; its rows are skipped,
//! visibly, without one), PODGC_BENCH_COMPARE (an older controller-manager: its idle RSS and
//! cycle CPU on the same objects, `_compare` figures, for before/after in one run).
//!
//! Objects: with its own control plane, the bench creates the first node and the first pod
//! through the apiserver and writes the rest straight into etcd as copies of what the apiserver
//! stored for them (same defaults, managedFields, size; own names, UIDs, nodes, env values):
//! 150k pods through the apiserver take over 20 minutes on 2 shared cores.
//! PODGC_BENCH_CREATE=api creates every object through the apiserver instead (96 at a time,
//! PODGC_BENCH_CREATE_CONCURRENCY), as it always does with `KUBECONFIG`.
//!
//! The orphan rows: each PodGC gets node sets of its own of the same size (so neither deletes
//! the other's orphans), and runs alone; the rate is taken by the bench's own watch on the pods,
//! from the first DELETED event of an orphan to the last, the same way for both. Ours runs with
//! `--orphan-quarantine=1s`, upstream's quarantine is a fixed 40 s: the time to the first delete
//! is printed, not counted in the rate. At the fast QPS a bare client (no rate limiter, 64 pods
//! at a time) gives the apiserver's limits on node sets of its own, measured the same way: with
//! the deletes alone (`orphans_raw_delete_per_s`, and `orphan_gc_ratio_to_raw` ours over it),
//! and with the two calls a PodGC makes per orphan, the status patch and the delete
//! (`orphans_raw_patch_delete_per_s`, `orphan_gc_ratio_to_raw_same_calls`).
//!
//! The TTL row (PODGC_BENCH_TTL_PODS, 10000, 0 skips it, on PODGC_BENCH_TTL_NODES, 1000): pods
//! finished as a kubelet reports it, PODGC_BENCH_TTL_EXPIRED (7500) of them 3 min before the
//! rest (the TTL counts from the apiserver's record of a pod's status, so the bench waits it
//! out); PodGC with --terminated-pod-ttl=180s --kube-api-qps=1000 collects the expired ones. It prints the RSS, the collection rate, and the 429 answers PodGC's client received and
//! the apiserver's own count of them (its /metrics). PODGC_BENCH_ONLY=ttl runs only this row;
//! PODGC_BENCH_ONLY=qps20 stops after the QPS 20 rows (with PODGC_BENCH_TTL_PODS=0: no TTL row).
//!
//! The relist row (first after the objects are made; needs the bench's own control plane): a
//! PodGC of its own, steady on every pod and node, is frozen (SIGSTOP) through an apiserver
//! restart after an etcd compaction (testkit's `Outage::FrozenThroughCompaction`), so that once
//! resumed its watches find their resourceVersion gone and list everything again. Its VmHWM is
//! reset (`/proc/PID/clear_refs` 5) just before, so `manager_rss_peak_relist_<size>` is the
//! peak from the freeze to two cycles after the relist, not the first list's;
//! `manager_rss_after_relist_<size>` is the RSS then, `manager_relist_<size>_s` the time from
//! the resume until every watch is healthy again (backoff included). The relist must show, or
//! the row fails: the pod watch's error counted and logged (not a silence), and the restarted
//! apiserver's count of cluster-wide pod LISTs above 0. The same for kube-controller-manager
//! (`kcm_rss_peak_relist_<size>`, `kcm_rss_after_relist_<size>`, `kcm_relist_<size>_s`: until
//! its reflector logs `Caches populated` for pods again), skipped visibly without it.
//! PODGC_BENCH_ONLY=relist makes the objects and runs only this row.
//!
//! The takeover row (`takeover.rs`, after the relist row): a leader dies and a standby takes
//! over; `manager_takeover_to_first_delete_<size>_s` (`kcm_…`) is the time from the death to
//! the new leader's first delete, `…_takeover_to_lease_…` to its holding the Lease, and
//! `takeover_to_first_delete_ratio_to_kcm_<size>` ours over kube-controller-manager's.
//! PODGC_BENCH_ONLY=takeover makes the objects and runs only this row.
//!
//! The start row, within the relist row (`start.rs`): each PodGC starts with
//! `--terminated-pod-gc-threshold=1` beside two finished pods of a namespace of its own, and
//! `manager_start_to_first_delete_<size>_s` (`kcm_…`) is the time from its process start to its
//! delete of the older one (the younger one must be left), and ours over kube-controller-manager's
//! (`start_to_first_delete_ratio_to_kcm_<size>`). Under it, a bare client's consistent
//! list of the same pods and nodes (`bare_list_consistent_<size>_s`, before the PodGCs) and
//! the pods at `resourceVersion=0` from the watch cache (`bare_list_rv0_pods_<size>_s`, last).
//! Beside the first, what separates a PodGC's list from it (`start::floor_variants`): JSON in
//! pages of 100, the pods decoded into PodGC's wire type in pages of 100 and 500 and pipelined,
//! and protobuf in pages of 100 and 500 (`bare_list_<variant>_<size>_s`).
//! PODGC_BENCH_ONLY=start makes the objects and runs only the start row (ours, no relist).

mod objects;
mod orphans;
mod process;
mod relist;
mod start;
mod steady;
mod takeover;
mod ttl;

use std::time::Duration;

use crate::{
    objects::{cleanup, create_nodes, create_pods, node_json, pod_json},
    orphans::OrphanRow,
    process::{Run, compact, control_plane_rss, kcm_bin, only, proc_meminfo},
    relist::relist_row,
    steady::Steady,
    ttl::ttl_row,
};
use testkit::figures::{bench as figure, env_num, mib};
use testkit::{seed, unique_name, wait_ready};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n_pods = env_num("PODGC_BENCH_PODS", 150_000);
    let n_nodes = env_num("PODGC_BENCH_NODES", 15_000).max(1);
    // Two sets of orphaned nodes at QPS 20 (ours, kube-controller-manager's), four at the fast
    // QPS (and the bare client's two).
    let slow_nodes = env_num("PODGC_BENCH_ORPHAN_NODES_SLOW", 60).min(n_nodes / 7);
    let fast_nodes = env_num("PODGC_BENCH_ORPHAN_NODES_FAST", 300).min(n_nodes / 7);
    let fast_qps = env_num("PODGC_BENCH_FAST_QPS", 1000);
    let quota_gib = env_num("PODGC_BENCH_ETCD_QUOTA_GIB", 8);
    let bin = std::env::var("PODGC_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_controller-manager").to_string());
    let quota = format!("--quota-backend-bytes={}", quota_gib << 30);
    let (cluster, cp) = if std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty()) {
        (
            testkit::cluster("podgc_load")
                .await
                .expect("KUBECONFIG is set"),
            None,
        )
    } else {
        match testkit::private_cluster_with("podgc_load", &[&quota]).await {
            Some((c, cp)) => (c, Some(cp)),
            None => {
                println!("SKIPPED podgc_load: neither KUBECONFIG nor KUBE_APISERVER set");
                return Ok(());
            }
        }
    };
    let result = run(
        &cluster,
        cp.as_deref(),
        &bin,
        n_pods,
        n_nodes,
        [slow_nodes, fast_nodes],
        fast_qps,
    )
    .await;
    let result = match result {
        Ok(())
            if env_num("PODGC_BENCH_TTL_PODS", 10_000) > 0
                && !only("relist")
                && !only("takeover")
                && !only("start") =>
        {
            compact(cp.as_deref(), "before the TTL row");
            ttl_row(&cluster, &bin).await
        }
        r => r,
    };
    drop(cluster);
    drop(cp);
    result
}

async fn run(
    cluster: &testkit::Cluster,
    cp: Option<&testkit::ControlPlane>,
    bin: &str,
    n_pods: usize,
    n_nodes: usize,
    [slow_nodes, fast_nodes]: [usize; 2],
    fast_qps: usize,
) -> anyhow::Result<()> {
    if only("ttl") {
        return Ok(());
    }
    let client = cluster.client.clone();
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let size = format!("{}k_pods", n_pods / 1000);
    eprintln!("podgc_load: {n_pods} pods on {n_nodes} nodes, binary {bin}");
    let ns = cluster
        .namespace_for_pods("podgc-bench", Duration::from_secs(60))
        .await?;
    let prefix = unique_name("gk-bench-node");
    let node_names: Vec<String> = (0..n_nodes).map(|i| format!("{prefix}-{i}")).collect();

    let result = async {
        let secs = match cp {
            Some(cp) if std::env::var("PODGC_BENCH_CREATE").as_deref() != Ok("api") => {
                let names = node_names.clone();
                let threads = env_num("PODGC_BENCH_SEED_THREADS", 4);
                let nodes = seed::Kind { what: "nodes", api_path: "/api/v1/nodes", etcd_prefix: "/registry/minions",
                    uid_kind: 0, n: n_nodes, threads };
                seed::seed(&client, cp, nodes,
                    node_json(&node_names[0]), move |i, v| {
                        v["metadata"]["name"] = names[i].clone().into();
                        v["metadata"]["labels"]["kubernetes.io/hostname"] = names[i].clone().into();
                    }).await?;
                let (names, ns2) = (node_names.clone(), ns.clone());
                let paths = (format!("/api/v1/namespaces/{ns}/pods"), format!("/registry/pods/{ns}"));
                let pods = seed::Kind { what: "pods", api_path: &paths.0, etcd_prefix: &paths.1, uid_kind: 1, n: n_pods, threads };
                seed::seed(&client, cp, pods,
                    pod_json(&ns, 0, &node_names[0]), move |i, v| {
                        let want = pod_json(&ns2, i, &names[i % names.len()]);
                        v["metadata"]["name"] = want["metadata"]["name"].clone();
                        v["metadata"]["labels"] = want["metadata"]["labels"].clone();
                        v["spec"]["nodeName"] = want["spec"]["nodeName"].clone();
                        for k in 0..2 {
                            for f in ["image", "env"] {
                                v["spec"]["containers"][k][f] = want["spec"]["containers"][k][f].clone();
                            }
                        }
                    }).await?
            }
            _ => {
                create_nodes(&client, &node_names).await?;
                create_pods("pods", &client, &ns, n_pods, &node_names).await?
            }
        };
        figure(&format!("create_{size}_s"), secs, "s");
        compact(cp, "after creating");
        println!("control plane: {}", control_plane_rss(cp));
        if !only("takeover") {
            relist_row(cluster, cp, bin, &size).await?;
        }
        if !only("relist") && !only("start") {
            takeover::takeover_row(cluster, bin, &size).await?;
        }
        if only("relist") || only("takeover") || only("start") {
            return anyhow::Ok(());
        }

        // Run 1: the default QPS budget (20/30).
        let run = Run::start(bin, &kubeconfig, &["--gc-period=5s"])?;
        let m = Steady::measure(&run).await?;
        println!("pods={n_pods} nodes={n_nodes}");
        m.print("", &size);
        println!("control plane: {}", control_plane_rss(cp));
        if let Ok(before) = std::env::var("PODGC_BENCH_COMPARE") {
            let old = Run::start(&before, &kubeconfig, &["--gc-period=5s", "--dry-run"])?;
            let m = Steady::measure(&old).await?;
            println!("the same, binary {before} (--dry-run, beside the first):");
            m.print("_compare", &size);
        }

        let row = OrphanRow { client: &client, ns: &ns, per_node: n_pods / n_nodes };
        let mut sets = node_names.chunks(slow_nodes.max(1));
        let slow_qps = "--kube-api-qps=20 --kube-api-burst=30";
        let ours = row.measure("groundskeeper", slow_qps, sets.next().expect("nodes")).await?;
        let hwm = mib(run.proc_status("VmHWM:"));
        println!("RSS after: {:.1} MiB; peak (VmHWM) over the whole run: {hwm:.1} MiB", mib(run.proc_status("VmRSS:")));
        figure(&format!("manager_rss_peak_run_{size}"), hwm, "MiB");
        // Every watch failure of the run (silences included), relists or re-watches: each one
        // stops deletions until the watch is back.
        let logs = run.bin.logs();
        let failures: Vec<&str> = logs.lines().filter(|l| l.contains("watch failed")).collect();
        for l in failures.iter().take(20) {
            println!("  {l}");
        }
        figure(&format!("manager_watch_failures_{size}"), failures.len() as f64, "count");
        drop(run);
        let kcm = kcm_bin();
        let kcm_rate = match &kcm {
            Some(kcm) => {
                println!("memory available before kube-controller-manager starts: {:.0} MiB", mib(proc_meminfo("MemAvailable:")));
                let k = Run::start_kcm(kcm, &kubeconfig, 20, 30, &[])?;
                // Its caches: the log line, then two of its 20 s cycles.
                k.bin.wait_for_log("Caches are synced", Duration::from_secs(900)).await?;
                tokio::time::sleep(Duration::from_secs(45)).await;
                let (rss, hwm) = (k.proc_status("VmRSS:"), k.proc_status("VmHWM:"));
                println!("kube-controller-manager (PodGC only): RSS steady {:.1} MiB; peak (VmHWM) {:.1} MiB", mib(rss), mib(hwm));
                figure(&format!("kcm_rss_steady_{size}"), mib(rss), "MiB");
                figure(&format!("kcm_rss_peak_{size}"), mib(hwm), "MiB");
                let r = row.measure("kube-controller-manager", slow_qps, sets.next().expect("nodes")).await?;
                drop(k);
                Some(r)
            }
            None => {
                println!("kube-controller-manager: SKIPPED (set PODGC_BENCH_KCM, or run `bash e2e/cluster.sh binaries` once)");
                None
            }
        };
        figure("orphans_per_s_qps20", ours, "pods/s");
        // At QPS 20 the budget is the limit: each orphan costs a PodGC two calls (the status
        // patch, the delete), so 10 pods/s.
        let budget = 20.0 / 2.0;
        figure("orphans_qps20_ratio_to_budget", ours / budget, "ratio");
        if let Some(k) = kcm_rate {
            figure("kcm_podgc_orphans_per_s_qps20", k, "pods/s");
            figure("orphans_per_s_ratio_qps20", ours / k, "ratio");
            figure("kcm_orphans_qps20_ratio_to_budget", k / budget, "ratio");
        }

        if only("qps20") {
            return anyhow::Ok(());
        }
        let mut sets = node_names[2 * slow_nodes..].chunks(fast_nodes.max(1));
        let (qps, burst) = (fast_qps.to_string(), (fast_qps * 2).to_string());
        let fast = format!("--kube-api-qps={qps} --kube-api-burst={burst}");
        let run = Run::start(
            bin,
            &kubeconfig,
            &["--gc-period=5s", "--kube-api-qps", &qps, "--kube-api-burst", &burst, "--gc-concurrency=64"],
        )?;
        wait_ready(run.admin(), Duration::from_secs(600), "podgc ready").await?;
        run.wait_cycles(1.0).await?;
        let ours = row.measure("groundskeeper (--gc-concurrency=64)", &fast, sets.next().expect("nodes")).await?;
        drop(run);
        let kcm_rate = match &kcm {
            Some(kcm) => {
                let k = Run::start_kcm(kcm, &kubeconfig, fast_qps, fast_qps * 2, &[])?;
                k.bin.wait_for_log("Caches are synced", Duration::from_secs(900)).await?;
                let r = row.measure("kube-controller-manager", &fast, sets.next().expect("nodes")).await?;
                drop(k);
                Some(r)
            }
            None => None,
        };
        // The limits: a bare client on node sets of its own, as fast as the apiserver accepts,
        // first making only the deletes, then the same two calls a PodGC makes per orphan.
        let mut raw = |calls| orphans::raw_rate(&client, &ns, sets.next().expect("nodes"), n_pods / n_nodes, 64, calls);
        let deletes = raw(orphans::Calls::DeleteOnly).await?;
        let same = raw(orphans::Calls::PatchThenDelete).await?;
        println!(
            "bare client (64 at a time, no rate limit): {} orphans at {:.1} pods/s making only the deletes; {} at {:.1} pods/s making a PodGC's two calls (status patch, delete)",
            deletes.pods, deletes.per_s, same.pods, same.per_s
        );
        figure("orphans_raw_delete_per_s", deletes.per_s, "pods/s");
        figure("orphans_raw_patch_delete_per_s", same.per_s, "pods/s");
        figure(&format!("orphans_per_s_qps{qps}"), ours, "pods/s");
        figure("orphan_gc_ratio_to_raw", ours / deletes.per_s, "ratio");
        figure("orphan_gc_ratio_to_raw_same_calls", ours / same.per_s, "ratio");
        if let Some(k) = kcm_rate {
            figure(&format!("kcm_podgc_orphans_per_s_qps{qps}"), k, "pods/s");
            figure(&format!("orphans_per_s_ratio_qps{qps}"), ours / k, "ratio");
            figure("kcm_orphan_gc_ratio_to_raw", k / deletes.per_s, "ratio");
            figure("kcm_orphan_gc_ratio_to_raw_same_calls", k / same.per_s, "ratio");
        }
        anyhow::Ok(())
    }
    .await;

    // Our own control plane goes with everything in it; a cluster named by KUBECONFIG is
    // cleaned.
    if cp.is_none() {
        cleanup(&client, &ns).await;
    }
    result
}
