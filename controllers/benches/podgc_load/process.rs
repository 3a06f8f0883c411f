//! The PodGCs under test as processes (ours or kube-controller-manager's), and what the bench
//! reads of them and of the control plane: memory, the apiserver's own request counts, etcd
//! compaction between rows, and which rows `PODGC_BENCH_ONLY` asks for.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use kube::Client;
use testkit::figures::{mib, status_kib};
use testkit::{Binary, http_get, wait_for};

/// A PodGC under test, ours or kube-controller-manager's: a child process whose memory and CPU
/// the bench reads.
pub(crate) struct Run {
    pub(crate) bin: Binary,
    /// Ours only: the admin server (readiness, metrics).
    pub(crate) admin: Option<SocketAddr>,
}

impl Run {
    pub(crate) fn start(path: &str, kubeconfig: &str, extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_as(path, kubeconfig, &["--leader-elect=false"], extra)
    }

    /// Ours as a candidate for the Lease `name` in `ns`, with the default lease timings.
    pub(crate) fn start_standby(
        path: &str,
        kubeconfig: &str,
        ns: &str,
        name: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let (ns, name) = (
            format!("--leader-elect-namespace={ns}"),
            format!("--leader-elect-lease-name={name}"),
        );
        Self::start_as(
            path,
            kubeconfig,
            &["--leader-elect=true", &ns, &name],
            extra,
        )
    }

    fn start_as(
        path: &str,
        kubeconfig: &str,
        election: &[&str],
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let mut args = election.to_vec();
        args.extend_from_slice(&["--controllers=podgc", "--orphan-quarantine=1s"]);
        args.extend_from_slice(extra);
        let (bin, admin) =
            Binary::start_with_admin(path, "podgc-bench", &args, &[("KUBECONFIG", kubeconfig)])?;
        Ok(Self {
            bin,
            admin: Some(admin),
        })
    }

    /// kube-controller-manager v1.36.2 with its PodGC only, at `qps`/`burst`, with `extra`.
    pub(crate) fn start_kcm(
        path: &str,
        kubeconfig: &str,
        qps: usize,
        burst: usize,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let kc = format!("--kubeconfig={kubeconfig}");
        let (qps, burst) = (
            format!("--kube-api-qps={qps}"),
            format!("--kube-api-burst={burst}"),
        );
        let port = format!("--secure-port={}", testkit::free_addr().port());
        let mut args = vec![
            kc.as_str(),
            "--controllers=pod-garbage-collector-controller",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            &qps,
            &burst,
            "--bind-address=127.0.0.1",
            &port,
            "-v=2",
        ];
        args.extend_from_slice(extra);
        let bin = Binary::start(
            path,
            "kcm-podgc-bench",
            &args,
            &[("KUBECONFIG", kubeconfig)],
        )?;
        Ok(Self { bin, admin: None })
    }

    pub(crate) fn admin(&self) -> SocketAddr {
        self.admin.expect("our PodGC has an admin server")
    }

    pub(crate) async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let (_, body) = http_get(self.admin(), "/metrics").await?;
        Ok(body
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0))
    }

    pub(crate) fn proc_status(&self, key: &str) -> u64 {
        status_kib(self.bin.pid().expect("running"), key)
    }

    /// utime + stime of the process, in seconds.
    pub(crate) fn cpu_seconds(&self) -> f64 {
        let pid = self.bin.pid().expect("running");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after_comm = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = after_comm.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>().unwrap_or(0.0) + f[12].parse::<f64>().unwrap_or(0.0);
        ticks / 100.0
    }

    pub(crate) async fn cycles(&self) -> anyhow::Result<f64> {
        self.metric("groundskeeper_podgc_cycle_duration_seconds_count ")
            .await
    }

    pub(crate) async fn wait_cycles(&self, n: f64) -> anyhow::Result<()> {
        wait_for(Duration::from_secs(600), "podgc cycles", || async {
            Ok(self.cycles().await? >= n)
        })
        .await
        .map(|_| ())
    }
}

/// A `/proc/meminfo` value in kB.
pub(crate) fn proc_meminfo(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .trim_end_matches(" kB")
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// 429s the apiserver itself answered so far, all clients: the sum of its
/// `apiserver_request_total{code="429"}` series (None if /metrics is not readable).
pub(crate) async fn apiserver_429s(client: &Client) -> Option<f64> {
    apiserver_requests(client, &["code=\"429\""]).await
}

/// Requests the apiserver answered since it started, all clients: the sum of its
/// `apiserver_request_total` series whose labels hold every one of `labels` (None if /metrics
/// is not readable).
pub(crate) async fn apiserver_requests(client: &Client, labels: &[&str]) -> Option<f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).ok()?;
    let text = client.request_text(req).await.ok()?;
    Some(
        text.lines()
            .filter(|l| {
                l.starts_with("apiserver_request_total{") && labels.iter().all(|k| l.contains(k))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// kube-controller-manager: `PODGC_BENCH_KCM`, else the node tarball's copy that
/// `e2e/cluster.sh binaries` unpacks into target/e2e/bin.
pub(crate) fn kcm_bin() -> Option<String> {
    if let Ok(p) = std::env::var("PODGC_BENCH_KCM") {
        return (!p.is_empty()).then_some(p);
    }
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/e2e/bin/kube-controller-manager");
    p.is_file().then(|| p.display().to_string())
}

/// RSS of etcd and kube-apiserver, when the bench started them.
pub(crate) fn control_plane_rss(cp: Option<&testkit::ControlPlane>) -> String {
    let Some(cp) = cp else {
        return "not ours (KUBECONFIG)".into();
    };
    let (etcd, apiserver) = cp.pids();
    let rss = |p: Option<u32>| p.map(|p| mib(status_kib(p, "VmRSS:"))).unwrap_or(0.0);
    format!(
        "kube-apiserver {:.0} MiB, etcd {:.0} MiB",
        rss(apiserver),
        rss(etcd)
    )
}

/// Compacts and defragments the bench's own etcd (between rows: 150k pods written and
/// deleted fill etcd 3.4's quota otherwise).
pub(crate) fn compact(cp: Option<&testkit::ControlPlane>, when: &str) {
    let Some(cp) = cp else { return };
    let t = Instant::now();
    match cp
        .compact_etcd()
        .and_then(|rev| Ok((rev, cp.defragment_etcd()?)))
    {
        Ok((rev, size)) => eprintln!(
            "etcd compacted at revision {rev} and defragmented {when}: {:.0} MiB, {:.1}s",
            size as f64 / 1048576.0,
            t.elapsed().as_secs_f64()
        ),
        Err(e) => eprintln!("WARNING: compacting etcd {when}: {e:#}"),
    }
}

/// Which row alone PODGC_BENCH_ONLY asks for (`ttl`, `qps20`, `relist`), if any.
pub(crate) fn only(row: &str) -> bool {
    std::env::var("PODGC_BENCH_ONLY").as_deref() == Ok(row)
}

/// Resets the peak RSS (VmHWM) of `pid` to its RSS now, so that the next read of it is the peak
/// of what came after (Linux's `clear_refs` 5; root, as the bench runs).
pub(crate) fn reset_peak(pid: u32) -> anyhow::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").map_err(|e| {
        anyhow::anyhow!("resetting VmHWM of pid {pid} (/proc/{pid}/clear_refs): {e}: a relist peak would be the first list's")
    })
}
