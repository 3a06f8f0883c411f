//! PodGC's Prometheus metrics.
//!
//! The two upstream counters, byte for byte (NotFound counts as an error, as upstream), a
//! groundskeeper counter of real failures, a cycle histogram, deletions of terminated pods by
//! the rule that chose them, the apiserver's 429s (and the Retry-Afters that were capped), and
//! the pods finalizers hold after their force delete was accepted.

use groundskeeper_plumbing::metrics::registered;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

use super::decide::Sweep;

#[derive(Clone)]
pub struct Metrics {
    deleted: IntCounterVec,
    errors: IntCounterVec,
    failures: IntCounterVec,
    terminated_deleted: IntCounterVec,
    /// 429 answers to PodGC's writes, counted by the client (each retry's too).
    pub throttled: IntCounter,
    /// 429s whose Retry-After was longer than PodGC waits.
    pub retry_after_capped: IntCounter,
    /// TTL deletions of pods never seen becoming final here (judged by their own times).
    pub ttl_first_listed: IntCounter,
    /// Pods chosen whose force delete was already accepted: no DELETE sent again.
    force_delete_skipped: IntCounterVec,
    /// Out-of-service pods kept because the live read of their node did not confirm it.
    out_of_service_kept: IntCounterVec,
    /// Pods whose force delete was accepted and that finalizers still hold, last cycle.
    pub finalizer_held: prometheus::IntGauge,
    /// The force-delete concurrency the apiserver's answers currently allow.
    pub concurrency_limit: prometheus::Gauge,
    pub cycle_seconds: Histogram,
}

impl Metrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let labels = &["namespace", "reason"];
        Ok(Self {
            deleted: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "pod_gc_collector_force_delete_pods_total",
                        "Number of pods that are being forcefully deleted since the Pod GC Controller started.",
                    ),
                    labels,
                ),
            )?,
            errors: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "pod_gc_collector_force_delete_pod_errors_total",
                        "Number of errors encountered when forcefully deleting the pods since the Pod GC Controller started.",
                    ),
                    labels,
                ),
            )?,
            failures: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_podgc_delete_errors_total",
                        "Force-deletions that failed (status patch or delete), not counting pods already gone or recreated, by what the apiserver answered (error: forbidden, not_found, conflict, too_many_requests, server_error, transport, other).",
                    ),
                    &["namespace", "reason", "error"],
                ),
            )?,
            terminated_deleted: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_podgc_terminated_deleted_total",
                        "Terminated pods PodGC deleted, by the rule that chose them: threshold (upstream's cluster-wide count), ttl, namespace-threshold.",
                    ),
                    &["reason"],
                ),
            )?,
            throttled: registered(
                registry,
                IntCounter::new(
                    "groundskeeper_podgc_api_throttled_total",
                    "HTTP 429 (Too Many Requests) answers to PodGC's status patches and deletes, including those the client retried.",
                ),
            )?,
            retry_after_capped: registered(
                registry,
                IntCounter::new(
                    "groundskeeper_podgc_retry_after_capped_total",
                    "429 answers whose Retry-After was longer than PodGC waits (60 s): it paused new deletes for 60 s instead.",
                ),
            )?,
            ttl_first_listed: registered(
                registry,
                IntCounter::new(
                    "groundskeeper_podgc_ttl_first_listed_total",
                    "Pods the TTL chose that were already terminated when this process first listed them, so it could not also time the TTL itself: judged by their own times, the kubelet's finishedAt but never before the apiserver's last record of their status.",
                ),
            )?,
            force_delete_skipped: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_podgc_force_delete_skipped_total",
                        "Pods a pass chose whose force delete the apiserver had already accepted (deletionTimestamp with deletionGracePeriodSeconds 0, held by finalizers): no DELETE was sent again, by the upstream reason of the pass.",
                    ),
                    &["reason"],
                ),
            )?,
            out_of_service_kept: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_podgc_out_of_service_kept_total",
                        "Terminating pods the out-of-service pass chose on its cache and did not force-delete because a live read of their node right before found it gone, Ready again or without the out-of-service taint (live_node gone, in_service), or could not read it (unread).",
                    ),
                    &["live_node"],
                ),
            )?,
            finalizer_held: registered(
                registry,
                prometheus::IntGauge::new(
                    "groundskeeper_podgc_finalizer_held_pods",
                    "Pods whose force delete was accepted (deletionGracePeriodSeconds 0) and that finalizers still hold, in the last cycle's snapshot: only whoever owns the finalizers can remove them.",
                ),
            )?,
            concurrency_limit: registered(
                registry,
                prometheus::Gauge::new(
                    "groundskeeper_podgc_delete_concurrency_limit",
                    "Force-deletes PodGC allows in flight, adapted to the apiserver's answers (AIMD, at most --gc-concurrency).",
                ),
            )?,
            cycle_seconds: registered(
                registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "groundskeeper_podgc_cycle_duration_seconds",
                        "Wall time of one PodGC cycle (all four passes, including API calls).",
                    )
                    .buckets(vec![
                        0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                    ]),
                ),
            )?,
        })
    }

    pub fn deleted(&self, namespace: &str, pass: Sweep) {
        self.deleted
            .with_label_values(&[namespace, pass.label()])
            .inc();
    }

    pub fn error(&self, namespace: &str, pass: Sweep) {
        self.errors
            .with_label_values(&[namespace, pass.label()])
            .inc();
    }

    /// An out-of-service pod kept on what the live read of its node said.
    pub fn out_of_service_kept(&self, live_node: &str) {
        self.out_of_service_kept
            .with_label_values(&[live_node])
            .inc();
    }

    #[cfg(test)]
    pub fn out_of_service_kept_count(&self, live_node: &str) -> u64 {
        self.out_of_service_kept
            .with_label_values(&[live_node])
            .get()
    }

    /// `n` pods chosen by `pass` were not force-deleted again: their force delete was accepted.
    pub fn force_delete_skipped(&self, pass: Sweep, n: usize) {
        self.force_delete_skipped
            .with_label_values(&[pass.label()])
            .inc_by(n as u64);
    }

    #[cfg(test)]
    pub fn force_delete_skipped_count(&self, pass: Sweep) -> u64 {
        self.force_delete_skipped
            .with_label_values(&[pass.label()])
            .get()
    }

    /// `error`: [`DeleteError::metric_label`](super::apply::DeleteError::metric_label).
    pub fn failure(&self, namespace: &str, pass: Sweep, error: &str) {
        self.failures
            .with_label_values(&[namespace, pass.label(), error])
            .inc();
    }

    #[cfg(test)]
    pub fn failures(&self, namespace: &str, pass: Sweep, error: &str) -> u64 {
        self.failures
            .with_label_values(&[namespace, pass.label(), error])
            .get()
    }

    /// A terminated pod was deleted (not merely attempted) by `pass`.
    pub fn terminated_deleted(&self, pass: Sweep) {
        if let Some(reason) = pass.terminated_reason() {
            self.terminated_deleted.with_label_values(&[reason]).inc();
        }
    }

    #[cfg(test)]
    pub fn terminated_count(&self, reason: &str) -> u64 {
        self.terminated_deleted.with_label_values(&[reason]).get()
    }

    #[cfg(test)]
    pub fn counts(&self, namespace: &str, pass: Sweep) -> (u64, u64) {
        let l = [namespace, pass.label()];
        (
            self.deleted.with_label_values(&l).get(),
            self.errors.with_label_values(&l).get(),
        )
    }
}
