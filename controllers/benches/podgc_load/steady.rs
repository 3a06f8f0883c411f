//! The steady row: a PodGC with full caches, its RSS and the CPU of an idle cycle.
//!
//! The steady RSS is read once the process has released its start-up pages
//! (`plumbing::resident`, [`AFTER_READY`] after ready): what it holds from then on. The RSS a
//! few cycles after ready (about 25 s; the release may have come by then) is printed beside it.

use std::time::{Duration, Instant};

use crate::process::Run;
use groundskeeper_plumbing::resident::AFTER_READY;
use testkit::figures::{bench as figure, mib};
use testkit::wait_ready;

/// One of our PodGCs idle on the full caches.
pub(crate) struct Steady {
    pub(crate) listed: Duration,
    pub(crate) rss_kib: u64,
    /// A few cycles after ready.
    pub(crate) early_rss_kib: u64,
    pub(crate) hwm_kib: u64,
    pub(crate) cpu: f64,
    pub(crate) wall: f64,
}

impl Steady {
    pub(crate) async fn measure(run: &Run) -> anyhow::Result<Self> {
        let t0 = Instant::now();
        wait_ready(run.admin(), Duration::from_secs(600), "podgc ready").await?;
        let listed = t0.elapsed();
        let ready = Instant::now();
        // Settle, then measure a few cycles' CPU (the process is otherwise idle).
        run.wait_cycles(2.0).await?;
        let c0 = run.cycles().await?;
        let cpu0 = run.cpu_seconds();
        let sum = "groundskeeper_podgc_cycle_duration_seconds_sum ";
        let wall0 = run.metric(sum).await?;
        run.wait_cycles(c0 + 3.0).await?;
        let cpu = (run.cpu_seconds() - cpu0) / 3.0;
        let wall = (run.metric(sum).await? - wall0) / 3.0;
        let early_rss_kib = run.proc_status("VmRSS:");
        settled(ready).await;
        Ok(Self {
            listed,
            cpu,
            wall,
            rss_kib: run.proc_status("VmRSS:"),
            early_rss_kib,
            hwm_kib: run.proc_status("VmHWM:"),
        })
    }

    pub(crate) fn print(&self, suffix: &str, size: &str) {
        println!(
            "caches listed (readyz) after {:.1}s",
            self.listed.as_secs_f64()
        );
        println!(
            "RSS steady (start-up pages released): {:.1} MiB; a few cycles after ready: {:.1} MiB; peak (VmHWM): {:.1} MiB",
            mib(self.rss_kib),
            mib(self.early_rss_kib),
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
            &format!("manager_rss_early_{size}{suffix}"),
            mib(self.early_rss_kib),
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

/// Returns once the process ready at `ready` has released its start-up pages, with a margin
/// for the release itself.
pub(crate) async fn settled(ready: Instant) {
    let at = ready + AFTER_READY + Duration::from_secs(5);
    tokio::time::sleep_until(at.into()).await;
}
