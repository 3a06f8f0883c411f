//! Tests of the applier against a scripted apiserver.
//!
//! The status patch and delete, skips and failures, counting, dry-run, the concurrency limit
//! and the fence.

use std::{sync::Arc, sync::atomic::Ordering};

use groundskeeper_plumbing::watch::cache::{Health, Stale};
use jiff::Timestamp;
use serde_json::json;
use testkit::api::Mock;
use tokio_util::sync::CancellationToken;

use super::apply::*;
use crate::leader::{Fence, Stamp, Term};
use crate::podgc::{
    decide::{Deletion, Sweep},
    facts::{Phase, PodFacts, example},
    metrics::Metrics,
};

/// The real writes, against the scripted apiserver.
fn writes(mock: &Mock) -> KubeWrites {
    KubeWrites::new(mock.client())
}

fn pod(name: &str, phase: Phase) -> PodFacts {
    PodFacts {
        node_name: Some("n1".into()),
        generation: Some(4).into(),
        ..example::pod("ns", name, phase)
    }
}

fn deletion(name: &str, phase: Phase, pass: Sweep) -> Deletion {
    Deletion {
        pod: pod(name, phase),
        pass,
        why: "test".into(),
    }
}

/// Pod `p` in `phase`, chosen by `pass`, force-deleted against an apiserver answering `codes`.
async fn force_delete_answering(codes: &[u16], phase: Phase, pass: Sweep) -> (Outcome, Mock) {
    let mock = Mock::answering(codes);
    let d = deletion("p", phase, pass);
    let o = force_delete(&writes(&mock), &Fence::unbounded(), &d, now()).await;
    (o, mock)
}

fn now() -> Timestamp {
    "2026-11-21T10:00:00.7Z".parse().unwrap()
}

#[test]
fn status_patch_for_an_orphan() {
    let p = pod("p", Phase::Running);
    assert_eq!(
        status_patch(&p, true, now()).unwrap(),
        json!({
            "metadata": {"uid": "uid-p"},
            "status": {
                "phase": "Failed",
                "observedGeneration": 4,
                "conditions": [{
                    "type": "DisruptionTarget", "status": "True",
                    "reason": "DeletionByPodGC", "message": "PodGC: node no longer exists",
                    "lastTransitionTime": "2026-11-21T10:00:00Z", "observedGeneration": 4
                }],
                "$setElementOrder/conditions": [{"type": "DisruptionTarget"}]
            }
        })
    );
}

#[test]
fn status_patch_rules() {
    // Final phases: no patch at all (so no condition either).
    for phase in [Phase::Succeeded, Phase::Failed] {
        assert_eq!(
            status_patch(&pod("p", phase), true, now()),
            None,
            "{phase:?}"
        );
    }
    // Every other phase, including empty and Unknown, is marked Failed.
    for phase in [Phase::Pending, Phase::Running, Phase::Unknown, Phase::Other] {
        let v = status_patch(&pod("p", phase), false, now()).unwrap();
        assert_eq!(v["status"]["phase"], "Failed", "{phase:?}");
        assert!(
            v["status"].get("conditions").is_none(),
            "{phase:?}: only orphans get it"
        );
    }
    // No generation known: no observedGeneration.
    let mut p = pod("p", Phase::Running);
    p.generation = None.into();
    let v = status_patch(&p, true, now()).unwrap();
    assert!(v["status"].get("observedGeneration").is_none());
    assert!(
        v["status"]["conditions"][0]
            .get("observedGeneration")
            .is_none()
    );
    // Already DisruptionTarget=True: its lastTransitionTime is kept.
    let mut p = pod("p", Phase::Running);
    p.set_disruption_target_true(Some(Some("2026-01-02T03:04:05Z".parse().unwrap())));
    let v = status_patch(&p, true, now()).unwrap();
    assert_eq!(
        v["status"]["conditions"][0]["lastTransitionTime"],
        "2026-01-02T03:04:05Z"
    );
}

#[test]
fn status_patch_keeps_the_existing_conditions_order() {
    // As kube-controller-manager's two-way patch: every type in order, a new DisruptionTarget
    // last, an existing one where it was.
    for (existing, order) in [
        (vec![], vec!["DisruptionTarget"]),
        (
            vec!["PodScheduled", "Initialized", "Ready"],
            vec!["PodScheduled", "Initialized", "Ready", "DisruptionTarget"],
        ),
        (
            vec!["Ready", "DisruptionTarget", "PodScheduled"],
            vec!["Ready", "DisruptionTarget", "PodScheduled"],
        ),
    ] {
        let mut p = pod("p", Phase::Running);
        p.condition_types = existing.iter().map(|t| (*t).into()).collect();
        let v = status_patch(&p, true, now()).unwrap();
        let want: Vec<_> = order.iter().map(|t| json!({ "type": t })).collect();
        assert_eq!(
            v["status"]["$setElementOrder/conditions"],
            json!(want),
            "{existing:?}"
        );
        assert_eq!(
            v["status"]["conditions"][0]["type"], "DisruptionTarget",
            "{existing:?}"
        );
    }
    // No condition patched: no order either.
    let v = status_patch(&pod("p", Phase::Running), false, now()).unwrap();
    assert!(v["status"].get("$setElementOrder/conditions").is_none());
}

#[tokio::test]
async fn orphan_is_patched_then_force_deleted_with_uid_precondition() {
    let (o, mock) = force_delete_answering(&[200, 200], Phase::Running, Sweep::Orphaned).await;
    assert_eq!(o, Outcome::Deleted);
    assert_eq!(
        mock.calls(),
        [
            "PATCH /api/v1/namespaces/ns/pods/p/status",
            "DELETE /api/v1/namespaces/ns/pods/p"
        ]
    );
    let seen = mock.seen();
    assert_eq!(
        seen[0].content_type,
        "application/strategic-merge-patch+json"
    );
    assert_eq!(
        seen[0].body,
        status_patch(&pod("p", Phase::Running), true, now()).unwrap()
    );
    assert_eq!(seen[1].body["gracePeriodSeconds"], 0);
    assert_eq!(seen[1].body["preconditions"]["uid"], "uid-p");
}

#[tokio::test]
async fn failed_patch_means_no_delete() {
    let (o, mock) = force_delete_answering(&[500], Phase::Pending, Sweep::Terminated).await;
    assert!(
        matches!(o, Outcome::Failed(DeleteError::Patch { .. })),
        "{o:?}"
    );
    assert_eq!(mock.calls(), ["PATCH /api/v1/namespaces/ns/pods/p/status"]);
}

#[tokio::test]
async fn other_invalid_patches_are_failures_not_skips() {
    let (o, mock) = force_delete_answering(&[421], Phase::Running, Sweep::Orphaned).await;
    assert!(
        matches!(o, Outcome::Failed(DeleteError::Patch { .. })),
        "{o:?}"
    );
    assert_eq!(mock.calls().len(), 1, "no delete after a failed patch");
}

#[tokio::test]
async fn final_pods_are_deleted_without_a_patch() {
    let (o, mock) = force_delete_answering(&[200], Phase::Succeeded, Sweep::Orphaned).await;
    assert_eq!(o, Outcome::Deleted);
    assert_eq!(mock.calls(), ["DELETE /api/v1/namespaces/ns/pods/p"]);
}

#[tokio::test]
async fn gone_and_recreated_pods_are_skipped() {
    let table = [
        (Phase::Failed, vec![404], Skip::Gone, 1),
        (Phase::Failed, vec![409], Skip::Recreated, 1),
        (Phase::Running, vec![404], Skip::Gone, 1),
        (Phase::Running, vec![409], Skip::Recreated, 1),
        (Phase::Running, vec![200, 409], Skip::Recreated, 2),
        (Phase::Running, vec![422], Skip::Recreated, 1),
    ];
    for (phase, codes, skip, calls) in table {
        let (o, mock) = force_delete_answering(&codes, phase, Sweep::Orphaned).await;
        assert_eq!(o, Outcome::Skipped(skip), "{phase:?} {codes:?}");
        assert_eq!(mock.calls().len(), calls, "{phase:?} {codes:?}");
    }
}

/// Out-of-service nodes read live are still out of service: the tests here are about writes
/// (`cycle_tests.rs` and `recheck.rs` test the live read).
fn applier(mock: &Mock, dry_run: bool, concurrency: usize) -> Applier {
    Applier {
        nodes: Some(crate::podgc::recheck::Always::out_of_service()),
        ..Applier::new(
            Arc::new(writes(mock)),
            Metrics::register(&prometheus::Registry::new()).unwrap(),
            concurrency,
            dry_run,
            CancellationToken::new(),
            Fence::unbounded(),
        )
    }
}

#[tokio::test]
async fn metrics_count_attempts_and_errors() {
    // Pod a: deleted. Pod b: patch fails (error). Pod c: already gone: an error for upstream's
    // counter (its DELETE returns NotFound), not for groundskeeper's.
    // Requests run one at a time so the script lines up with the pods.
    let mock = Mock::answering(&[200, 200, 500, 404]);
    let a = applier(&mock, false, 1);
    let tally = a
        .apply(vec![
            deletion("a", Phase::Running, Sweep::OutOfService),
            deletion("b", Phase::Running, Sweep::OutOfService),
            deletion("c", Phase::Failed, Sweep::OutOfService),
        ])
        .await;
    assert_eq!(
        tally,
        Tally {
            deleted: 1,
            would_delete: 0,
            skipped: 1,
            failed: 1,
            fenced: 0,
        }
    );
    assert_eq!(a.metrics.counts("ns", Sweep::OutOfService), (3, 2));
    assert_eq!(
        a.metrics
            .failures("ns", Sweep::OutOfService, "server_error"),
        1
    );
    assert_eq!(a.metrics.counts("ns", Sweep::Orphaned), (0, 0));
    assert_eq!(a.metrics.failures("ns", Sweep::Orphaned, "server_error"), 0);
}

#[tokio::test]
async fn dry_run_writes_nothing_and_counts_nothing() {
    let mock = Mock::default();
    let a = applier(&mock, true, 4);
    let ds: Vec<_> = Sweep::ALL
        .iter()
        .map(|p| deletion(p.label(), Phase::Running, *p))
        .collect();
    let tally = a.apply(ds).await;
    assert_eq!(tally.would_delete, 4);
    assert_eq!(tally.deleted + tally.failed + tally.skipped, 0);
    assert!(mock.calls().is_empty(), "{:?}", mock.calls());
    for p in Sweep::ALL {
        assert_eq!(a.metrics.counts("ns", p), (0, 0));
    }
}

#[tokio::test]
async fn deletes_overlap_up_to_the_concurrency_bound() {
    let mock = Mock::default();
    let a = applier(&mock, false, 3);
    let ds: Vec<_> = (0..12)
        .map(|i| deletion(&format!("p{i}"), Phase::Succeeded, Sweep::Orphaned))
        .collect();
    let tally = a.apply(ds).await;
    assert_eq!(tally.deleted, 12);
    let peak = mock.max_in_flight.load(Ordering::SeqCst);
    assert!(peak > 1 && peak <= 3, "peak in flight {peak}");
}

fn fence(term: Term) -> (tokio::sync::watch::Sender<Term>, Fence) {
    let (tx, rx) = tokio::sync::watch::channel(term);
    (tx, Fence::new(rx))
}

#[tokio::test]
async fn a_standby_writes_nothing_and_counts_nothing() {
    let mock = Mock::default();
    let (_tx, standby) = fence(Term::Standby);
    let a = Applier {
        fence: standby.clone(),
        ..applier(&mock, false, 4)
    };
    let ds: Vec<_> = Sweep::ALL
        .iter()
        .map(|p| deletion(p.label(), Phase::Running, *p))
        .collect();
    let tally = a.apply(ds).await;
    assert_eq!(tally.deleted + tally.failed + tally.skipped, 0, "{tally:?}");
    assert!(mock.calls().is_empty(), "{:?}", mock.calls());
    for p in Sweep::ALL {
        assert_eq!(a.metrics.counts("ns", p), (0, 0));
    }
    let events = groundskeeper_plumbing::events::Events::new(
        mock.client(),
        groundskeeper_plumbing::events::Reporter::in_pod(crate::podgc::notice::CONTROLLER),
        false,
    )
    .fenced(Arc::new(standby.clone()));
    let e = events
        .publish(&crate::podgc::notice::invalid_policy(
            "ns",
            "bad annotation".into(),
        ))
        .await;
    assert!(e.is_err(), "{e:?}");
    assert!(
        mock.calls().is_empty(),
        "no Event either: {:?}",
        mock.calls()
    );
    let d = deletion("p", Phase::Running, Sweep::Orphaned);
    assert_eq!(
        force_delete(&writes(&mock), &standby, &d, now()).await,
        Outcome::Fenced
    );
    assert!(mock.calls().is_empty());
}

/// A patch hung on a frozen connection is dropped when the term ends: no delete follows, and
/// the pass returns at the term instead of waiting for the request timeout.
#[tokio::test(start_paused = true)]
async fn in_flight_writes_are_dropped_when_the_term_ends() {
    let mock = Mock::default();
    mock.hang.store(true, Ordering::SeqCst);
    let t0 = tokio::time::Instant::now();
    let (_tx, f) = fence(Term::Until(Stamp::at(
        t0 + std::time::Duration::from_secs(3),
    )));
    let a = Applier {
        fence: f,
        ..applier(&mock, false, 2)
    };
    let ds: Vec<_> = (0..5)
        .map(|i| deletion(&format!("p{i}"), Phase::Running, Sweep::Orphaned))
        .collect();
    let tally = a.apply(ds).await;
    assert_eq!(t0.elapsed(), std::time::Duration::from_secs(3));
    assert_eq!(tally.deleted, 0);
    assert_eq!(
        tally.fenced, 2,
        "the two in flight; the rest never started: {tally:?}"
    );
    assert_eq!(
        mock.calls(),
        Vec::<String>::new(),
        "hung calls were never answered"
    );
}

#[tokio::test(start_paused = true)]
async fn a_loss_between_patch_and_delete_stops_the_delete() {
    let mock = Mock::default();
    let (tx, f) = fence(Term::Unbounded);
    let d = deletion("p", Phase::Running, Sweep::Orphaned);
    let w = writes(&mock);
    let run = force_delete(&w, &f, &d, now());
    // The first poll sends the patch; the loss lands while it is answered.
    let lose = async {
        tokio::task::yield_now().await;
        tx.send_replace(Term::Standby);
    };
    let (o, ()) = tokio::join!(run, lose);
    assert_eq!(o, Outcome::Fenced);
    assert!(
        !mock.calls().iter().any(|c| c.starts_with("DELETE")),
        "{:?}",
        mock.calls()
    );
}

#[tokio::test]
async fn a_429_pauses_new_starts_halves_the_limit_and_the_pod_is_retried() {
    // The first delete is throttled (no Retry-After in the body: the default pause).
    let mock = Mock::answering(&[429]);
    let a = applier(&mock, false, 4);
    let started = std::time::Instant::now();
    let ds: Vec<_> = (0..6)
        .map(|i| deletion(&format!("p{i}"), Phase::Succeeded, Sweep::Terminated))
        .collect();
    let tally = a.apply(ds).await;
    assert_eq!(tally.deleted, 6, "{tally:?}");
    assert_eq!(tally.failed, 0);
    assert_eq!(a.metrics.throttled.get(), 1);
    assert_eq!(mock.calls().len(), 7, "six deletes and the one retried");
    assert!(
        started.elapsed() >= crate::pacing::limit::DEFAULT_PAUSE.mul_f64(0.9),
        "the throttled pod waited for the pause: {:?}",
        started.elapsed()
    );
    assert_eq!(a.metrics.terminated_count("threshold"), 6);
}

#[tokio::test]
async fn terminated_deletions_are_counted_by_rule_and_only_when_deleted() {
    // p-ttl deleted, p-ns deleted, p-gone already gone (404), orphan deleted (not a terminated rule).
    let mock = Mock::answering(&[200, 200, 404, 200, 200]);
    let a = applier(&mock, false, 1);
    a.apply(vec![
        deletion("p-ttl", Phase::Succeeded, Sweep::Ttl),
        deletion("p-ns", Phase::Failed, Sweep::NamespaceThreshold),
        deletion("p-gone", Phase::Failed, Sweep::NamespaceThreshold),
        deletion("orphan", Phase::Running, Sweep::Orphaned),
    ])
    .await;
    for (reason, n) in [("threshold", 0), ("ttl", 1), ("namespace-threshold", 1)] {
        assert_eq!(a.metrics.terminated_count(reason), n, "{reason}");
    }
    // The upstream-named counter sees them under upstream's reason.
    assert_eq!(a.metrics.counts("ns", Sweep::Ttl).0, 3);
}

/// What must NOT happen: deletions decided on a snapshot keep starting after a watch it came
/// from failed or relisted (a node back, a namespace opted out, unseen).
#[tokio::test]
async fn no_deletion_starts_once_a_watch_of_the_snapshot_relisted() {
    let readiness = groundskeeper_plumbing::Readiness::default();
    let flags = [
        readiness.register("podgc/pods"),
        readiness.register("podgc/nodes"),
    ];
    flags.iter().for_each(|f| f.mark_ready());
    let ds = || -> Vec<_> {
        (0..3)
            .map(|i| deletion(&format!("p{i}"), Phase::Running, Sweep::OutOfService))
            .collect()
    };

    let health = Health::new(flags.clone());
    let mock = Mock::default();
    let a = Applier {
        health: health.clone(),
        seen: health.seen(),
        ..applier(&mock, false, 1)
    };
    assert_eq!(
        health.may_act(&a.seen),
        Ok(()),
        "all healthy: the cycle may start"
    );
    assert_eq!(a.apply(ds()).await.deleted, 3, "unchanged: the pass runs");

    let mock = Mock::default();
    let a = Applier {
        health: health.clone(),
        seen: health.seen(),
        ..applier(&mock, false, 1)
    };
    assert_eq!(health.may_act(&a.seen), Ok(()));
    flags[1].relist_started(); // the node watch relists after the snapshot
    let tally = a.apply(ds()).await;
    assert_eq!(tally.deleted, 0, "{tally:?}");
    assert!(mock.calls().is_empty(), "{:?}", mock.calls());
    flags[1].mark_ready(); // listed again: a new epoch, still not the snapshot's
    assert_eq!(
        health.may_act(&a.seen),
        Err(Stale::ChangedSince),
        "the next cycle decides again"
    );
}

/// Answers the first delete 429 with `retryAfterSeconds` in its Status body; the rest 200.
struct AsksToWait {
    seconds: i32,
    asked: std::sync::atomic::AtomicBool,
}

impl Writes for AsksToWait {
    fn patch_status<'a>(
        &'a self,
        _: &'a PodFacts,
        _: serde_json::Value,
    ) -> futures::future::BoxFuture<'a, Result<Option<u64>, kube::Error>> {
        Box::pin(async { Ok(None) })
    }

    fn delete<'a>(
        &'a self,
        _: &'a PodFacts,
    ) -> futures::future::BoxFuture<'a, Result<Option<u64>, kube::Error>> {
        let first = !self.asked.swap(true, Ordering::SeqCst);
        let seconds = self.seconds;
        Box::pin(async move {
            if !first {
                return Ok(None);
            }
            let mut status =
                kube::core::Status::failure("slow down", "TooManyRequests").with_code(429);
            status.details =
                Some(serde_json::from_value(json!({ "retryAfterSeconds": seconds })).unwrap());
            Err(kube::Error::Api(status.boxed()))
        })
    }
}

/// A hostile or broken Retry-After: a 429 asking to wait a day pauses new deletes for the cap (60 s), and
/// says so in a counter; a Retry-After within the cap is not counted.
#[tokio::test]
async fn a_retry_after_of_a_day_is_capped_and_counted() {
    use crate::pacing::limit::RETRY_AFTER_MAX;
    for (seconds, capped) in [(86_400, true), (3, false)] {
        let a = Applier::new(
            Arc::new(AsksToWait {
                seconds,
                asked: false.into(),
            }),
            Metrics::register(&prometheus::Registry::new()).unwrap(),
            1,
            false,
            CancellationToken::new(),
            Fence::unbounded(),
        );
        let run = {
            let a = a.clone();
            tokio::spawn(async move {
                a.apply(vec![deletion("p", Phase::Succeeded, Sweep::Terminated)])
                    .await
            })
        };
        let asked_at = std::time::Instant::now();
        let paused = loop {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            if let Some(t) = a.pacer.limit().paused(std::time::Instant::now()) {
                break t;
            }
        };
        assert!(
            paused <= asked_at + RETRY_AFTER_MAX + std::time::Duration::from_secs(1),
            "{seconds} s asked: paused {:?}",
            paused - asked_at
        );
        assert_eq!(a.metrics.throttled.get(), 1);
        assert_eq!(
            a.metrics.retry_after_capped.get(),
            u64::from(capped),
            "{seconds} s"
        );
        run.abort();
    }
}

/// The applier's halt, on its own: each reason alone stops new deletions, and none of them
/// leaves the pass running.
#[tokio::test]
async fn each_reason_alone_halts_new_deletions() {
    use crate::pacing::Halt;
    let readiness = groundskeeper_plumbing::Readiness::default();
    let watch = readiness.register("podgc/nodes");
    watch.mark_ready();
    let health = Health::new([watch.clone()]);
    let mock = Mock::default();
    let running = || Applier {
        health: health.clone(),
        seen: health.seen(),
        ..applier(&mock, false, 1)
    };
    assert!(!running().halted(), "nothing stops it");

    let a = running();
    a.token.cancel();
    assert!(a.halted(), "shutdown");

    let (_tx, standby) = fence(Term::Standby);
    let a = Applier {
        fence: standby,
        ..running()
    };
    assert!(a.halted(), "not leading");

    let a = running();
    watch.relist_started();
    assert!(a.halted(), "a watch of the snapshot relists");
    watch.mark_ready();
    assert!(
        a.halted(),
        "and stays halted once it listed again: a new epoch"
    );
    assert!(!running().halted(), "a new cycle's snapshot may run");
}

#[tokio::test]
async fn a_failed_force_delete_is_counted_under_what_the_apiserver_answered() {
    // (answers, phase: Running is patched first, Failed is only deleted, label)
    let table = [
        (vec![403], Phase::Running, "forbidden"),
        (vec![200, 403], Phase::Running, "forbidden"),
        (vec![500], Phase::Failed, "server_error"),
        (vec![503], Phase::Running, "server_error"),
        (vec![400], Phase::Failed, "other"),
    ];
    for (answers, phase, want) in table {
        let mock = Mock::answering(&answers);
        let a = applier(&mock, false, 1);
        let tally = a.apply(vec![deletion("p", phase, Sweep::Orphaned)]).await;
        assert_eq!(tally.failed, 1, "{answers:?}");
        for label in groundskeeper_plumbing::client::API_ERROR_LABELS {
            assert_eq!(
                a.metrics.failures("ns", Sweep::Orphaned, label),
                u64::from(label == want),
                "{answers:?}: {label}"
            );
        }
    }
}

/// A terminated pod in `ns` as the apiserver serves it, created `i` seconds into the day, held
/// by a finalizer; `accepted`: its force delete was accepted (what a DELETE with grace 0 leaves).
fn held_pod(i: usize, accepted: bool) -> crate::podgc::wire::WirePod {
    let mut meta = json!({
        "name": format!("held-{i:03}"), "namespace": "ns", "uid": format!("uid-held-{i}"),
        "creationTimestamp": Timestamp::from_second(1_767_225_600 + i as i64).unwrap().to_string(),
        "finalizers": ["example.com/archive"],
    });
    if accepted {
        meta["deletionTimestamp"] = json!("2026-01-02T00:00:00Z");
        meta["deletionGracePeriodSeconds"] = json!(0);
    }
    serde_json::from_value(json!({
        "metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}
    }))
    .unwrap()
}

fn deletes(mock: &Mock) -> usize {
    mock.calls()
        .iter()
        .filter(|c| c.starts_with("DELETE"))
        .count()
}

/// The threshold over pods a finalizer holds: the first cycle force-deletes them; once the
/// apiserver has accepted that (deletionTimestamp, grace 0) the next cycles choose them again,
/// as upstream's does, and send nothing.
#[tokio::test]
async fn finalizer_held_pods_are_not_force_deleted_again() {
    use crate::podgc::{cache::Caches, decide::terminated};
    use kube::runtime::watcher::Event;
    const N: usize = 40;
    let mut caches = Caches::default();
    for i in 0..N {
        caches.fold_pod(Event::Apply(held_pod(i, false)));
    }
    let mock = Mock::default();
    let a = applier(&mock, false, 4);
    let chosen = terminated(&caches.snapshot().pods, 10);
    assert_eq!(chosen.len(), N - 10);
    let first = a.apply(chosen).await;
    assert_eq!((first.deleted, deletes(&mock)), (N - 10, N - 10));

    // The apiserver accepted every one; finalizers keep them listed.
    for i in 0..N - 10 {
        caches.fold_pod(Event::Apply(held_pod(i, true)));
    }
    for cycle in 0..3 {
        let chosen = terminated(&caches.snapshot().pods, 10);
        assert_eq!(
            chosen.len(),
            N - 10,
            "cycle {cycle}: still chosen, as upstream"
        );
        let again = a.apply(chosen).await;
        assert_eq!(
            deletes(&mock),
            N - 10,
            "cycle {cycle}: no DELETE sent again"
        );
        assert_eq!((again.deleted, again.skipped), (0, N - 10), "cycle {cycle}");
    }
    assert_eq!(
        a.metrics.force_delete_skipped_count(Sweep::Terminated),
        3 * (N - 10) as u64
    );
    assert_eq!(
        a.metrics.counts("ns", Sweep::Terminated),
        ((N - 10) as u64, 0)
    );
}

/// Upstream's threshold, written as it reads: every terminated pod counts, the first
/// `len − threshold` in eviction-then-age order are chosen. Over generated mixes of pods whose
/// force delete was accepted and fresh ones, the applier sends a DELETE to exactly the chosen
/// pods that were not accepted yet, and counts the rest as skipped.
#[tokio::test]
async fn held_pods_count_towards_the_threshold_as_upstream() {
    use crate::podgc::decide::{eviction_then_age, terminated};
    for seed in 0..200u64 {
        let mut rng = testkit::rng::Rng(seed);
        let pods: Vec<PodFacts> = (0..rng.below(30))
            .map(|i| {
                let phase = rng.pick(&[Phase::Succeeded, Phase::Failed, Phase::Running]);
                let mut p = pod(&format!("p{i:02}"), phase);
                p.created = example::at(rng.below(50) as i64).into();
                p.evicted = phase == Phase::Failed && rng.chance(20);
                if rng.chance(40) {
                    p = example::force_deleted(p);
                }
                p
            })
            .collect();
        let threshold = rng.below(25) as i64 + 1;
        let mut done: Vec<&PodFacts> = pods.iter().filter(|p| p.phase.is_terminated()).collect();
        done.sort_by(|a, b| eviction_then_age(a, b));
        let count = (done.len() as i64 - threshold).max(0) as usize;
        let upstream: Vec<&str> = done[..count].iter().map(|p| p.name()).collect();

        let chosen = terminated(&pods, threshold);
        let names: Vec<&str> = chosen.iter().map(|d| d.pod.name()).collect();
        assert_eq!(
            names, upstream,
            "seed {seed}: the threshold chose as upstream"
        );
        let mut want: Vec<String> = done[..count]
            .iter()
            .filter(|p| !p.force_deleted)
            .map(|p| format!("DELETE /api/v1/namespaces/ns/pods/{}", p.name()))
            .collect();
        let mock = Mock::default();
        let a = applier(&mock, false, 4);
        let tally = a.apply(chosen).await;
        let mut sent = mock.calls();
        sent.sort();
        want.sort();
        assert_eq!(
            sent, want,
            "seed {seed}: DELETEs only to pods not yet accepted"
        );
        assert_eq!(tally.skipped, count - want.len(), "seed {seed}");
        assert_eq!(
            a.metrics.force_delete_skipped_count(Sweep::Terminated),
            (count - want.len()) as u64,
            "seed {seed}"
        );
    }
}

/// An orphan whose force delete was accepted while it still ran gets the status patch the Job
/// controller reads (Failed, DisruptionTarget), and no second DELETE.
#[tokio::test]
async fn a_held_orphan_is_marked_failed_but_not_deleted_again() {
    let mock = Mock::default();
    let d = Deletion {
        pod: example::force_deleted(pod("p", Phase::Running)),
        pass: Sweep::Orphaned,
        why: "test".into(),
    };
    let a = applier(&mock, false, 1);
    let tally = a.apply(vec![d]).await;
    assert_eq!(
        mock.calls(),
        ["PATCH /api/v1/namespaces/ns/pods/p/status"],
        "the patch, no DELETE"
    );
    assert_eq!(tally.skipped, 1);
    assert_eq!(a.metrics.force_delete_skipped_count(Sweep::Orphaned), 1);
    assert_eq!(a.metrics.counts("ns", Sweep::Orphaned), (0, 0));
}
