//! The webhook's Prometheus metrics.
//!
//! Reviews answered (by subject and result), how long they took, what the server's limits
//! refused. The certificate's are `tls/metrics.rs`.

use groundskeeper_plumbing::metrics::registered;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub reviews: IntCounterVec,
    pub duration: HistogramVec,
    /// `error`: [`ReviewError::metric_label`](super::serve::ReviewError::metric_label).
    pub errors: IntCounterVec,
    /// `reason`: one of [`refused_reasons`](super::limits::refused_reasons).
    pub refused: IntCounterVec,
    pub connections: IntGauge,
}

impl Metrics {
    pub fn register(registry: &Registry) -> anyhow::Result<Self> {
        let reviews = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_admission_reviews_total",
                    "Admission reviews answered by the sysctl webhook, by subject (binding, pod) and result: \
                     allowed, audited (forbidden, node in Audit: allowed with a warning), denied (forbidden, \
                     node in Enforce: the pod was kept off the node), dry_run (would have been denied), \
                     unavailable (caches not listed: HTTP 503, failurePolicy decides), unreadable, error.",
                ),
                &["subject", "result"],
            ),
        )?;
        let duration = registered(
            registry,
            HistogramVec::new(
                HistogramOpts::new(
                    "groundskeeper_sysctl_admission_review_duration_seconds",
                    "Time to answer one admission review, by subject (a binding whose pod is not cached yet \
                     includes a GET of the pod).",
                )
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
                &["subject"],
            ),
        )?;
        let errors = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_webhook_errors_total",
                    "Admission reviews the webhook could not judge (result unreadable or error in \
                     groundskeeper_sysctl_admission_reviews_total), by error: unreadable, or what the \
                     apiserver answered when a binding's pod had to be read (forbidden, not_found, conflict, \
                     too_many_requests, server_error, transport, other).",
                ),
                &["error"],
            ),
        )?;
        let refused = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_webhook_refused_total",
                    "Connections and requests the webhook server cut short at one of its limits, by reason: \
                     body_too_large (413), busy (429: too many requests in flight), source_busy (429: too many \
                     from the caller's address), body_timeout (408), body_too_slow (408: under the minimum rate), \
                     answer_timeout (503), header_timeout (headers not sent in time, or a connection idle too \
                     long), handshake_timeout, connections, source_connections, handshakes, source_handshakes \
                     (a connection closed at once at that cap), replaced (an idle or silent connection closed to \
                     make room for a new one), lookup_budget (a binding judged without its pod: the webhook's \
                     budget of pod lookups was spent).",
                ),
                &["reason"],
            ),
        )?;
        for reason in super::limits::refused_reasons() {
            refused.with_label_values(&[reason]);
        }
        let connections = registered(
            registry,
            IntGauge::new(
                "groundskeeper_sysctl_webhook_connections",
                "Connections open to the webhook server (after their TLS handshake).",
            ),
        )?;
        Ok(Self {
            refused,
            connections,
            errors,
            reviews,
            duration,
        })
    }
}

impl Metrics {
    /// What the server and its listener count.
    pub fn counters(&self) -> super::limits::Counters {
        super::limits::Counters {
            refused: self.refused.clone(),
            connections: self.connections.clone(),
        }
    }
}
