//! The steady row: a PodGC with full caches, its RSS and the CPU of an idle cycle.
//!
//! The steady RSS is read after the cycles whose CPU is measured, about five cycles after ready.
//! The bench runs the binary as a plain process, in no cgroup of its own, so RSS is what there
//! is to read. It counts every code page the process has mapped; the working set kubelet counts
//! (the cgroup's usage less its inactive file pages) leaves most of them out (docs/benchmarks.md).

use std::time::{Duration, Instant};

use crate::process::Run;
use testkit::figures::{bench as figure, mib};
use testkit::wait_ready;

/// One of our PodGCs idle on the full caches.
pub(crate) struct Steady {
    pub(crate) listed: Duration,
    pub(crate) rss_kib: u64,
    pub(crate) hwm_kib: u64,
    pub(crate) cpu: f64,
    pub(crate) wall: f64,
}

impl Steady {
    pub(crate) async fn measure(run: &Run) -> anyhow::Result<Self> {
        let t0 = Instant::now();
        wait_ready(run.admin(), Duration::from_secs(600), "podgc ready").await?;
        let listed = t0.elapsed();
        // Settle, then measure a few cycles' CPU (the process is otherwise idle).
        run.wait_cycles(2.0).await?;
        let c0 = run.cycles().await?;
        let cpu0 = run.cpu_seconds();
        let sum = "groundskeeper_podgc_cycle_duration_seconds_sum ";
        let wall0 = run.metric(sum).await?;
        run.wait_cycles(c0 + 3.0).await?;
        let cpu = (run.cpu_seconds() - cpu0) / 3.0;
        let wall = (run.metric(sum).await? - wall0) / 3.0;
        Ok(Self {
            listed,
            cpu,
            wall,
            rss_kib: run.proc_status("VmRSS:"),
            hwm_kib: run.proc_status("VmHWM:"),
        })
    }

    pub(crate) fn print(&self, suffix: &str, size: &str) {
        println!(
            "caches listed (readyz) after {:.1}s",
            self.listed.as_secs_f64()
        );
        println!(
            "RSS steady (five cycles after ready): {:.1} MiB; peak (VmHWM): {:.1} MiB",
            mib(self.rss_kib),
            mib(self.hwm_kib)
        );
        println!(
            "one idle cycle: {:.3} s CPU (process total per cycle interval), {:.4} s wall",
            self.cpu, self.wall
        );
        figure(
            &format!("manager_rss_steady_{size}{suffix}"),
            mib(self.rss_kib),
            "MiB",
        );
        figure(
            &format!("manager_rss_peak_{size}{suffix}"),
            mib(self.hwm_kib),
            "MiB",
        );
        figure(
            &format!("podgc_cycle_cpu_{size}{suffix}"),
            self.cpu * 1000.0,
            "ms",
        );
        figure(
            &format!("manager_caches_listed_{size}_s{suffix}"),
            self.listed.as_secs_f64(),
            "s",
        );
    }
}
