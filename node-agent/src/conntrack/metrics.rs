//! The cleanup's Prometheus metrics, all under groundskeeper's names: kube-proxy runs on the same
//! node and exports its own conntrack reconciler's series, so a name of kube-proxy's here would add
//! the two processes' figures in any query that does not select one job (docs/conntrack.md).
//! What kube-proxy also measures keeps its buckets and `ip_family` values, so the two can be
//! compared side by side. Names and labels do not change.

use groundskeeper_plumbing::metrics::registered;
use prometheus::{
    Gauge, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, exponential_buckets,
};

#[derive(Clone)]
pub struct Metrics {
    pub pass_duration: HistogramVec,
    pub deleted: IntCounterVec,
    pub scanned: IntCounterVec,
    pub failures: IntCounterVec,
    pub fill_ratio: Gauge,
    pub skipped: IntCounterVec,
}

impl Metrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            pass_duration: registered(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "groundskeeper_conntrack_pass_duration_seconds",
                        "Duration of cleanup passes that listed the whole conntrack table, by IP family \
                         (kube-proxy's reconciler buckets)",
                    )
                    .buckets(exponential_buckets(0.001, 2.0, 15)?),
                    &["ip_family"],
                ),
            )?,
            deleted: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_conntrack_entries_deleted_total",
                        "Stale conntrack entries deleted by cleanup passes, by IP family",
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
    fn metrics_have_their_names_help_and_kube_proxys_buckets() {
        let r = Registry::new();
        let m = Metrics::register(&r).unwrap();
        m.pass_duration.with_label_values(&["IPv4"]).observe(0.002);
        m.deleted.with_label_values(&["IPv6"]).inc_by(3);
        m.scanned.with_label_values(&["IPv4"]).inc_by(10);
        let text = groundskeeper_plumbing::metrics::render(&r);
        let missing: Vec<&str> = [
            "# HELP groundskeeper_conntrack_pass_duration_seconds Duration of cleanup passes",
            "groundskeeper_conntrack_pass_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.001\"} 0",
            "groundskeeper_conntrack_pass_duration_seconds_bucket{ip_family=\"IPv4\",le=\"16.384\"} 1",
            "# HELP groundskeeper_conntrack_entries_deleted_total Stale conntrack entries deleted",
            "groundskeeper_conntrack_entries_deleted_total{ip_family=\"IPv6\"} 3",
            "groundskeeper_conntrack_entries_scanned_total{ip_family=\"IPv4\"} 10",
            "groundskeeper_conntrack_table_fill_ratio 0",
        ]
        .into_iter()
        .filter(|want| !text.contains(want))
        .collect();
        assert!(missing.is_empty(), "missing {missing:?} in\n{text}");
        let buckets = text
            .lines()
            .filter(|l| l.starts_with("groundskeeper_conntrack_pass_duration_seconds_bucket"))
            .count();
        assert_eq!(buckets, 16, "15 exponential buckets + Inf");
    }

    /// kube-proxy exports its conntrack reconciler's series from the same node: every family
    /// here is groundskeeper's, whatever is added, so no query for kube-proxy's sums ours in.
    #[test]
    fn every_family_is_groundskeepers_own() {
        let r = Registry::new();
        let m = Metrics::register(&r).unwrap();
        // A child of every vector, so each family is gathered.
        m.pass_duration.with_label_values(&["IPv4"]).observe(0.002);
        m.deleted.with_label_values(&["IPv4"]).inc();
        m.scanned.with_label_values(&["IPv4"]).inc();
        m.failures.with_label_values(&["IPv4", "io"]).inc();
        m.skipped.with_label_values(&["stale-model"]).inc();
        let names: Vec<String> = r.gather().iter().map(|f| f.name().to_owned()).collect();
        assert_eq!(
            names.len(),
            6,
            "every field of Metrics is gathered: {names:?}"
        );
        for name in &names {
            assert!(
                name.starts_with("groundskeeper_conntrack_"),
                "{name} is not under groundskeeper_conntrack_"
            );
        }
    }
}
