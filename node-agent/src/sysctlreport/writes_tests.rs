//! The worker's writes beside its reports: SysctlPolicy status writes spread by node and not
//! repeated, and failed writes counted by what the apiserver answered.

use std::time::Duration;

use groundskeeper_plumbing::watch::cache::Update;

use super::crd::Mode;
use super::worker::status_offset;
use super::worker_tests::{Rig, Write, pod, policy, started};

#[tokio::test(start_paused = true)]
async fn policy_status_writes_are_spread_by_node_and_not_repeated_when_unchanged() {
    let (a, b) = ("node-a", "node-b");
    assert_ne!(status_offset(a), status_offset(b));
    assert!(status_offset(a) < Duration::from_secs(5) && status_offset(b) < Duration::from_secs(5));

    for node in [a, b] {
        let start = tokio::time::Instant::now();
        let mut r = Rig::new(node, Mode::Audit, false).await;
        let p = policy("p", Mode::Audit);
        r.policy(&p).await;
        // Seen again before it is due: still one write.
        r.policy(&p).await;
        let due = start + status_offset(node);
        tokio::time::advance(due - tokio::time::Instant::now() - Duration::from_millis(1)).await;
        r.worker.on_tick().await;
        assert_eq!(r.fake.take(), [], "{node}: not before its turn");
        tokio::time::advance(Duration::from_millis(1)).await;
        r.worker.on_tick().await;
        let written = r.fake.take();
        let [Write::Status { policy, status }] = &written[..] else {
            panic!("{node}: one status write, got {written:?}");
        };
        assert_eq!(policy, "p");
        assert_eq!(status.conditions[0].reason, "PatternsValid", "{node}");

        // The watch brings the written status back: nothing is due any more.
        let mut with_status = p.clone();
        with_status.status = Some(status.clone());
        r.policy(&with_status).await;
        tokio::time::advance(Duration::from_secs(10)).await;
        r.worker.on_tick().await;
        assert_eq!(r.fake.take(), [], "{node}: not repeated");
    }
}

#[tokio::test(start_paused = true)]
async fn a_status_already_written_by_another_agent_is_not_written_again() {
    let mut r = Rig::new("node-a", Mode::Audit, false).await;
    let p = policy("p", Mode::Audit);
    r.policy(&p).await;
    // Before this node's turn, another agent's write reaches the cache.
    let mut other = Rig::new("node-b", Mode::Audit, false).await;
    other.policy(&p).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    other.worker.on_tick().await;
    let [Write::Status { status, .. }] = &other.fake.take()[..] else {
        panic!("node-b writes")
    };
    let mut with_status = p.clone();
    with_status.status = Some(status.clone());
    r.cache
        .lock()
        .policies
        .apply(Update::Apply("p".into(), with_status));
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), []);
}

#[tokio::test]
async fn a_failed_write_is_counted_under_what_the_apiserver_answered() {
    for (code, want) in [
        (403, "forbidden"),
        (429, "too_many_requests"),
        (404, "not_found"),
    ] {
        let mut r = Rig::new("node-a", Mode::Enforce, false).await;
        let p = pod("web", &["kernel.msgmax"]);
        r.pod(&p).await;
        r.fake.fail_next(code);
        r.pod(&started(p)).await;
        for label in groundskeeper_plumbing::client::API_ERROR_LABELS {
            assert_eq!(
                r.metrics.write_errors.with_label_values(&[label]).get(),
                u64::from(label == want),
                "HTTP {code}: {label}"
            );
        }
    }
}
