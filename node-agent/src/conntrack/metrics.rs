//! The cleanup's Prometheus metrics: kube-proxy's names for what kube-proxy also measures,
//! groundskeeper's for the rest. Names and labels do not change.

use groundskeeper_plumbing::metrics::registered;
use prometheus::{
    Gauge, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, exponential_buckets,
};

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
        Ok(Self {
            sync_duration: registered(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                        "ReconcileConntrackFlowsLatency latency in seconds",
                    )
                    .buckets(exponential_buckets(0.001, 2.0, 15)?),
                    &["ip_family"],
                ),
            )?,
            deleted: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "kubeproxy_conntrack_reconciler_deleted_entries_total",
                        "Cumulative conntrack flows deleted by conntrack reconciler",
                    ),
                    &["ip_family"],
                ),
            )?,
            scanned: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_conntrack_entries_scanned_total",
                        "Conntrack entries read and judged by cleanup passes (UDP only when the kernel filters)",
                    ),
                    &["ip_family"],
                ),
            )?,
            failures: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_conntrack_pass_failures_total",
                        "Cleanup passes that failed to list (nothing deleted) or to delete, by error: \
                         socket_open (no CAP_NET_ADMIN), interrupted, filter_rejected, kernel, io, parse, delete",
                    ),
                    &["ip_family", "error"],
                ),
            )?,
            fill_ratio: registered(
                registry,
                Gauge::new(
                    "groundskeeper_conntrack_table_fill_ratio",
                    "nf_conntrack_count / nf_conntrack_max, read at each cleanup pass",
                ),
            )?,
            skipped: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_conntrack_passes_skipped_total",
                        "Cleanup passes not run, by reason (stale-model: a Service/EndpointSlice watch was failing or relisting)",
                    ),
                    &["reason"],
                ),
            )?,
        })
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
        let missing: Vec<&str> = [
            "# HELP kubeproxy_conntrack_reconciler_sync_duration_seconds ReconcileConntrackFlowsLatency latency in seconds",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.001\"} 0",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family=\"IPv4\",le=\"16.384\"} 1",
            "# HELP kubeproxy_conntrack_reconciler_deleted_entries_total Cumulative conntrack flows deleted by conntrack reconciler",
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv6\"} 3",
            "groundskeeper_conntrack_entries_scanned_total{ip_family=\"IPv4\"} 10",
            "groundskeeper_conntrack_table_fill_ratio 0",
        ]
        .into_iter()
        .filter(|want| !text.contains(want))
        .collect();
        assert!(missing.is_empty(), "missing {missing:?} in\n{text}");
        let buckets = text
            .lines()
            .filter(|l| {
                l.starts_with("kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket")
            })
            .count();
        assert_eq!(buckets, 16, "15 exponential buckets + Inf");
    }
}
