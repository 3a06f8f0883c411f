//! The thread that owns the netlink socket and runs passes, off the async runtime (netlink
//! calls block). With a namespace name it lives in that namespace, so its socket and its
//! reads of /proc/sys/net do too.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use prometheus::{
    Gauge, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, exponential_buckets,
};
use tokio::sync::oneshot;

use super::clean::Model;
use super::msg::{AF_INET, AF_INET6};
use super::netns;
use super::pass::{PassError, PassState, family_name, run_pass};
use super::socket::Conntrack;

/// Fill ratio above which every pass logs a warning (and, once per crossing, a Node Event).
const FILL_WARNING: f64 = super::fill::THRESHOLD;

#[derive(Clone)]
pub struct Metrics {
    pub sync_duration: HistogramVec,
    pub deleted: IntCounterVec,
    pub scanned: IntCounterVec,
    pub failures: IntCounterVec,
    pub fill_ratio: Gauge,
    pub skipped: IntCounterVec,
}

impl Metrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
            sync_duration: HistogramVec::new(
                HistogramOpts::new(
                    "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                    "ReconcileConntrackFlowsLatency latency in seconds",
                )
                .buckets(exponential_buckets(0.001, 2.0, 15)?),
                &["ip_family"],
            )?,
            deleted: IntCounterVec::new(
                Opts::new(
                    "kubeproxy_conntrack_reconciler_deleted_entries_total",
                    "Cumulative conntrack flows deleted by conntrack reconciler",
                ),
                &["ip_family"],
            )?,
            scanned: IntCounterVec::new(
                Opts::new(
                    "groundskeeper_conntrack_entries_scanned_total",
                    "Conntrack entries read and judged by cleanup passes (UDP only when the kernel filters)",
                ),
                &["ip_family"],
            )?,
            failures: IntCounterVec::new(
                Opts::new(
                    "groundskeeper_conntrack_pass_failures_total",
                    "Cleanup passes that failed to list (nothing deleted) or to delete",
                ),
                &["ip_family"],
            )?,
            fill_ratio: Gauge::new(
                "groundskeeper_conntrack_table_fill_ratio",
                "nf_conntrack_count / nf_conntrack_max, read at each cleanup pass",
            )?,
            skipped: IntCounterVec::new(
                Opts::new(
                    "groundskeeper_conntrack_passes_skipped_total",
                    "Cleanup passes not run, by reason (stale-model: a Service/EndpointSlice watch was failing or relisting)",
                ),
                &["reason"],
            )?,
        };
        registry.register(Box::new(m.sync_duration.clone()))?;
        registry.register(Box::new(m.deleted.clone()))?;
        registry.register(Box::new(m.scanned.clone()))?;
        registry.register(Box::new(m.failures.clone()))?;
        registry.register(Box::new(m.fill_ratio.clone()))?;
        registry.register(Box::new(m.skipped.clone()))?;
        Ok(m)
    }
}

/// Totals of one round (both families), for the adaptive interval.
#[derive(Debug, Default, Clone, Copy)]
pub struct RoundSummary {
    pub scanned: usize,
    pub deleted: usize,
    /// The table's fill, read at the start of the round (None when unreadable).
    pub fill: Option<super::fill::Fill>,
}

struct Request {
    model: Arc<Model>,
    reply: oneshot::Sender<RoundSummary>,
}

pub struct Worker {
    metrics: Metrics,
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    pub fn start(netns: Option<String>, metrics: Metrics, dry_run: bool) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Request>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let kept = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("conntrack".into())
            .spawn(move || {
                if let Some(ns) = &netns
                    && let Err(e) = netns::enter(ns)
                {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                let _ = ready_tx.send(Ok(()));
                let mut round = Round {
                    socket: None,
                    metrics,
                    dry_run,
                    state: [PassState::default(); 2],
                };
                for req in rx {
                    let summary = round.run(&req.model);
                    let _ = req.reply.send(summary);
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("conntrack thread died while starting"))??;
        Ok(Self {
            metrics: kept,
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Runs one round (IPv4 then IPv6) and waits for it.
    pub async fn round(&self, model: Arc<Model>) -> RoundSummary {
        let (reply, rx) = oneshot::channel();
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send(Request { model, reply }).is_ok());
        if !sent {
            return RoundSummary::default();
        }
        rx.await.unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Round {
    socket: Option<Conntrack>,
    metrics: Metrics,
    dry_run: bool,
    state: [PassState; 2],
}

impl Round {
    fn run(&mut self, model: &Model) -> RoundSummary {
        let mut summary = RoundSummary {
            fill: self.observe_fill(),
            ..RoundSummary::default()
        };
        for (i, (family, fm)) in [(AF_INET, &model.ipv4), (AF_INET6, &model.ipv6)]
            .into_iter()
            .enumerate()
        {
            let fam = family_name(family);
            if fm.is_empty() {
                continue;
            }
            if self.socket.is_none() {
                match Conntrack::open() {
                    Ok(s) => self.socket = Some(s),
                    Err(e) => {
                        self.metrics.failures.with_label_values(&[fam]).inc();
                        tracing::error!(ip_family = fam, error = %e, "cannot open the conntrack netlink socket (needs CAP_NET_ADMIN); pass skipped");
                        return summary;
                    }
                }
            }
            let socket = self.socket.as_mut().expect("opened above");
            let start = Instant::now();
            let dry_run = self.dry_run;
            let mut log = |e: &super::msg::Entry, why| {
                if dry_run {
                    tracing::info!(ip_family = fam, entry = %e, reason = ?why, "dry run: would delete stale conntrack entry");
                } else {
                    tracing::debug!(ip_family = fam, entry = %e, reason = ?why, "deleting stale conntrack entry");
                }
            };
            let res = run_pass(socket, family, fm, &mut self.state[i], dry_run, &mut log);
            let elapsed = start.elapsed();
            let report = match res {
                Ok(r) => r,
                Err(PassError::Dump(e)) => {
                    self.metrics.failures.with_label_values(&[fam]).inc();
                    tracing::error!(ip_family = fam, error = %e, "failed to list conntrack entries; nothing deleted");
                    // The socket may hold the rest of a broken dump: start clean next time.
                    self.socket = None;
                    continue;
                }
                Err(PassError::Delete { report, source }) => {
                    self.metrics.failures.with_label_values(&[fam]).inc();
                    tracing::error!(ip_family = fam, error = %source, deleted = report.deleted, "deleting stale conntrack entries failed");
                    self.socket = None;
                    report
                }
            };
            self.metrics
                .sync_duration
                .with_label_values(&[fam])
                .observe(elapsed.as_secs_f64());
            self.metrics
                .deleted
                .with_label_values(&[fam])
                .inc_by(report.deleted as u64);
            self.metrics
                .scanned
                .with_label_values(&[fam])
                .inc_by(report.scanned as u64);
            summary.scanned += report.scanned;
            summary.deleted += report.deleted;
            tracing::info!(
                ip_family = fam,
                scanned = report.scanned,
                stale = report.stale,
                deleted = report.deleted,
                already_gone = report.already_gone,
                failed = report.failed_deletes,
                partial = report.partial,
                dry_run,
                kernel_filter = self.state[i].kernel_filter,
                elapsed_ms = elapsed.as_millis() as u64,
                "conntrack cleanup pass"
            );
        }
        summary
    }

    fn observe_fill(&self) -> Option<super::fill::Fill> {
        let read = |name: &str| -> Option<f64> {
            std::fs::read_to_string(format!("/proc/sys/net/netfilter/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let (Some(count), Some(max)) = (read("nf_conntrack_count"), read("nf_conntrack_max"))
        else {
            return None;
        };
        if max <= 0.0 {
            return None;
        }
        let ratio = count / max;
        self.metrics.fill_ratio.set(ratio);
        if ratio > FILL_WARNING {
            tracing::warn!(
                nf_conntrack_count = count,
                nf_conntrack_max = max,
                ratio,
                "conntrack table is over 80% full; new flows will be dropped when it is full (raise --conntrack-max-per-core / --conntrack-min)"
            );
        }
        Some(super::fill::Fill { count, max })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_use_upstream_names_help_and_buckets() {
        let r = Registry::new();
        let m = Metrics::register(&r).unwrap();
        m.sync_duration.with_label_values(&["IPv4"]).observe(0.002);
        m.deleted.with_label_values(&["IPv6"]).inc_by(3);
        m.scanned.with_label_values(&["IPv4"]).inc_by(10);
        let text = groundskeeper_plumbing::metrics::render(&r);
        for want in [
            "# HELP kubeproxy_conntrack_reconciler_sync_duration_seconds ReconcileConntrackFlowsLatency latency in seconds",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.001\"} 0",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family=\"IPv4\",le=\"16.384\"} 1",
            "# HELP kubeproxy_conntrack_reconciler_deleted_entries_total Cumulative conntrack flows deleted by conntrack reconciler",
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv6\"} 3",
            "groundskeeper_conntrack_entries_scanned_total{ip_family=\"IPv4\"} 10",
            "groundskeeper_conntrack_table_fill_ratio 0",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        let buckets = text
            .lines()
            .filter(|l| {
                l.starts_with("kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket")
            })
            .count();
        assert_eq!(buckets, 16, "15 exponential buckets + Inf");
    }
}
