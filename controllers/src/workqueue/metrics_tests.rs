//! The `workqueue_*` series against client-go's bookkeeping: examples with paused time, and
//! depth = keys waiting or re-added while in progress, over generated operation sequences.

use std::time::Duration;

use prometheus::{Registry, proto::MetricType};
use testkit::rng::Rng;

use super::{RateLimit, WorkQueue, metrics::QueueMetricFamilies};

fn named(registry: &Registry) -> WorkQueue<String> {
    let families = QueueMetricFamilies::register(registry).expect("register");
    WorkQueue::named(RateLimit::default(), &families, "ipaddresses")
}

/// The value of `family{name="ipaddresses"}`: a gauge's or counter's value, a histogram's
/// (count, sum) as (count, sum).
fn value(registry: &Registry, family: &str) -> (f64, f64) {
    let f = registry
        .gather()
        .into_iter()
        .find(|f| f.name() == family)
        .unwrap_or_else(|| panic!("{family} not exported"));
    let m = &f.get_metric()[0];
    assert_eq!(m.get_label()[0].name(), "name");
    assert_eq!(m.get_label()[0].value(), "ipaddresses");
    match f.get_field_type() {
        MetricType::HISTOGRAM => {
            let h = m.get_histogram();
            (h.get_sample_count() as f64, h.get_sample_sum())
        }
        MetricType::GAUGE => (m.get_gauge().get_value(), 0.0),
        MetricType::COUNTER => (m.get_counter().get_value(), 0.0),
        other => panic!("{family} is a {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn every_series_is_exported_at_zero_under_the_upstream_name() {
    let registry = Registry::new();
    let _q = named(&registry);
    for family in [
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_retries_total",
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
    ] {
        assert_eq!(value(&registry, family), (0.0, 0.0), "{family}");
    }
}

#[tokio::test(start_paused = true)]
async fn adds_depth_durations_and_retries_follow_client_go() {
    let registry = Registry::new();
    let q = named(&registry);
    q.add("a".into());
    q.add("a".into());
    q.add("b".into());
    assert_eq!(
        value(&registry, "workqueue_adds_total").0,
        2.0,
        "a duplicate is no add"
    );
    assert_eq!(value(&registry, "workqueue_depth").0, 2.0);

    tokio::time::sleep(Duration::from_secs(3)).await;
    let a = q.get().await.expect("open");
    assert_eq!(value(&registry, "workqueue_depth").0, 1.0);
    assert_eq!(
        value(&registry, "workqueue_queue_duration_seconds"),
        (1.0, 3.0)
    );

    // Re-added while in progress: an add and depth, handed out only after done.
    q.add(a.clone());
    assert_eq!(value(&registry, "workqueue_adds_total").0, 3.0);
    assert_eq!(value(&registry, "workqueue_depth").0, 2.0);

    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (unfinished, longest) = (
        value(&registry, "workqueue_unfinished_work_seconds").0,
        value(&registry, "workqueue_longest_running_processor_seconds").0,
    );
    assert!((1.5..=2.1).contains(&longest), "longest running {longest}");
    assert_eq!(unfinished, longest, "one key in progress");

    q.done(&a);
    assert_eq!(
        value(&registry, "workqueue_work_duration_seconds"),
        (1.0, 2.1)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        value(&registry, "workqueue_longest_running_processor_seconds").0,
        0.0
    );

    q.add_rate_limited("c".into());
    q.add_rate_limited("c".into());
    assert_eq!(value(&registry, "workqueue_retries_total").0, 2.0);
}

#[tokio::test(start_paused = true)]
async fn depth_is_the_keys_waiting_over_generated_sequences() {
    for seed in 1..=200u64 {
        let registry = Registry::new();
        let q = named(&registry);
        let mut rng = Rng(seed);
        let mut held: Vec<String> = Vec::new();
        let (mut adds, mut handed_out) = (0u64, 0u64);
        for step in 0..60 {
            match rng.below(4) {
                0 | 1 => {
                    let k = format!("k{}", rng.below(5));
                    let fresh = !q.lock().dirty.contains(&k);
                    q.add(k);
                    adds += u64::from(fresh);
                }
                2 if !q.is_empty() => {
                    held.push(q.get().await.expect("open"));
                    handed_out += 1;
                }
                _ if !held.is_empty() => {
                    let k = held.swap_remove(rng.below(held.len()));
                    q.done(&k);
                }
                _ => {}
            }
            let dirty = q.lock().dirty.len() as f64;
            let at = format!("seed {seed} step {step}");
            assert_eq!(value(&registry, "workqueue_depth").0, dirty, "{at}");
            assert_eq!(
                value(&registry, "workqueue_adds_total").0,
                adds as f64,
                "{at}"
            );
            let (gets, _) = value(&registry, "workqueue_queue_duration_seconds");
            assert_eq!(gets, handed_out as f64, "{at}");
        }
    }
}
