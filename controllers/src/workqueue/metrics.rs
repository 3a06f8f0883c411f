//! client-go's work-queue metrics (`k8s.io/component-base/metrics/prometheus/workqueue`), under
//! their upstream names and `name` label, so a dashboard or alert written for
//! kube-controller-manager's `workqueue_depth{name="ipaddresses"}` reads ours unchanged.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Weak},
    time::Duration,
};

use groundskeeper_plumbing::metrics::registered;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use tokio::time::Instant;

/// How often the in-progress gauges are refreshed: client-go's `updatePeriod`.
const UPDATE_PERIOD: Duration = Duration::from_millis(500);

/// The metric families, registered once per registry; each queue takes its own `name` series.
#[derive(Clone)]
pub struct QueueMetricFamilies {
    depth: IntGaugeVec,
    adds: IntCounterVec,
    queue_duration: HistogramVec,
    work_duration: HistogramVec,
    unfinished_work: GaugeVec,
    longest_running: GaugeVec,
    retries: IntCounterVec,
}

impl QueueMetricFamilies {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let name = &["name"];
        // client-go: ExponentialBuckets(10e-9, 10, 10), 10 ns to 10 s.
        let buckets = || prometheus::exponential_buckets(1e-8, 10.0, 10).expect("valid buckets");
        Ok(Self {
            depth: registered(
                registry,
                IntGaugeVec::new(
                    Opts::new("workqueue_depth", "Current depth of workqueue"),
                    name,
                ),
            )?,
            adds: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "workqueue_adds_total",
                        "Total number of adds handled by workqueue",
                    ),
                    name,
                ),
            )?,
            queue_duration: registered(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "workqueue_queue_duration_seconds",
                        "How long in seconds an item stays in workqueue before being requested.",
                    )
                    .buckets(buckets()),
                    name,
                ),
            )?,
            work_duration: registered(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "workqueue_work_duration_seconds",
                        "How long in seconds processing an item from workqueue takes.",
                    )
                    .buckets(buckets()),
                    name,
                ),
            )?,
            unfinished_work: registered(
                registry,
                GaugeVec::new(
                    Opts::new(
                        "workqueue_unfinished_work_seconds",
                        "How many seconds of work has done that is in progress and hasn't been observed by \
                         work_duration. Large values indicate stuck threads. One can deduce the number of \
                         stuck threads by observing the rate at which this increases.",
                    ),
                    name,
                ),
            )?,
            longest_running: registered(
                registry,
                GaugeVec::new(
                    Opts::new(
                        "workqueue_longest_running_processor_seconds",
                        "How many seconds has the longest running processor for workqueue been running.",
                    ),
                    name,
                ),
            )?,
            retries: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "workqueue_retries_total",
                        "Total number of retries handled by workqueue",
                    ),
                    name,
                ),
            )?,
        })
    }
}

/// One queue's series, resolved once, and the times they are measured from (client-go's
/// `defaultQueueMetrics`).
pub(super) struct QueueMetrics<K> {
    depth: IntGauge,
    adds: IntCounter,
    queue_duration: Histogram,
    work_duration: Histogram,
    unfinished_work: Gauge,
    longest_running: Gauge,
    retries: IntCounter,
    /// When each queued key was added (its first add since it was last handed out).
    added: HashMap<K, Instant>,
    /// When each key being worked on was handed out.
    started: HashMap<K, Instant>,
}

impl<K: Clone + Eq + Hash> QueueMetrics<K> {
    /// Every series exists from here on, at zero, as upstream's do.
    pub(super) fn new(families: &QueueMetricFamilies, name: &str) -> Self {
        let name = &[name];
        Self {
            depth: families.depth.with_label_values(name),
            adds: families.adds.with_label_values(name),
            queue_duration: families.queue_duration.with_label_values(name),
            work_duration: families.work_duration.with_label_values(name),
            unfinished_work: families.unfinished_work.with_label_values(name),
            longest_running: families.longest_running.with_label_values(name),
            retries: families.retries.with_label_values(name),
            added: HashMap::new(),
            started: HashMap::new(),
        }
    }

    pub(super) fn add(&mut self, key: &K) {
        self.adds.inc();
        self.depth.inc();
        self.added.entry(key.clone()).or_insert_with(Instant::now);
    }

    pub(super) fn get(&mut self, key: &K) {
        let now = Instant::now();
        self.depth.dec();
        if let Some(t) = self.added.remove(key) {
            self.queue_duration.observe((now - t).as_secs_f64());
        }
        self.started.insert(key.clone(), now);
    }

    pub(super) fn done(&mut self, key: &K) {
        if let Some(t) = self.started.remove(key) {
            self.work_duration.observe(t.elapsed().as_secs_f64());
        }
    }

    pub(super) fn retry(&self) {
        self.retries.inc();
    }

    /// The in-progress gauges: the summed and the longest age of the work handed out and not done.
    pub(super) fn update_unfinished(&self) {
        let now = Instant::now();
        let (mut total, mut longest) = (0.0f64, 0.0f64);
        for t in self.started.values() {
            let age = (now - *t).as_secs_f64();
            total += age;
            longest = longest.max(age);
        }
        self.unfinished_work.set(total);
        self.longest_running.set(longest);
    }
}

/// Calls `update` every [`UPDATE_PERIOD`] until it returns false or the queue is dropped, as
/// client-go's `updateUnfinishedWorkLoop` does: a stuck worker shows in the gauges between
/// queue operations, which is when it matters.
pub(super) fn spawn_updater<T, F>(queue: &Arc<T>, update: F)
where
    T: Send + Sync + 'static,
    F: Fn(&T) -> bool + Send + 'static,
{
    let weak: Weak<T> = Arc::downgrade(queue);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPDATE_PERIOD);
        loop {
            tick.tick().await;
            match weak.upgrade() {
                Some(q) if update(&q) => {}
                _ => return,
            }
        }
    });
}
