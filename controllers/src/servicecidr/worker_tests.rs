//! The sync layer against recorded writes: dry-run, retries and drops, events, gauges.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use groundskeeper_plumbing::{
    events,
    watch::cache::{Health, Shared},
};
use jiff::Timestamp;
use k8s_openapi::{
    api::networking::v1::{IPAddress, ServiceCIDR},
    apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time},
};
use kube::runtime::watcher::Event;
use testkit::networking::{allocated_ip, service_cidr};

use super::{
    apply::{Notice, Writes, Written},
    cache::CidrCache,
    conflict::KCM_FIELD_MANAGER,
    decide::{FINALIZER, ReadyCondition},
    metrics::Metrics,
    worker::{EVENT_DELETION_BLOCKED, EVENT_STATUS_ERROR, MAX_RETRIES, Worker},
};
use crate::workqueue::{RateLimit, WorkQueue};

#[derive(Default)]
struct Recorded {
    calls: Mutex<Vec<String>>,
    events: Mutex<Vec<Notice>>,
    /// The HTTP status every Ready apply fails with.
    fail_apply: Option<u16>,
    /// The HTTP status every finalizer removal fails with.
    fail_remove: Option<u16>,
}

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("boom", "InternalError")
            .with_code(code)
            .boxed(),
    )
}

impl Writes for Arc<Recorded> {
    async fn add_finalizer(&self, name: &str) -> Result<Written, kube::Error> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("add-finalizer {name}"));
        Ok(Written {
            resource_version: Some("101".into()),
            applied_at: None,
        })
    }
    async fn remove_finalizer(&self, name: &str, rv: &str) -> Result<(), kube::Error> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("remove-finalizer {name} at {rv}"));
        match self.fail_remove {
            Some(code) => Err(api_error(code)),
            None => Ok(()),
        }
    }
    async fn apply_ready(
        &self,
        name: &str,
        c: &ReadyCondition,
        _now: Timestamp,
    ) -> Result<Written, kube::Error> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("apply {name} {} {}", c.status, c.reason));
        if let Some(code) = self.fail_apply {
            return Err(api_error(code));
        }
        Ok(Written {
            resource_version: Some("102".into()),
            applied_at: None,
        })
    }
}

/// The Event writer's sink: each Event created or counted in its series, as the sync sent it.
impl events::Sink for Recorded {
    fn create<'a>(
        &'a self,
        e: &'a k8s_openapi::api::events::v1::Event,
    ) -> futures::future::BoxFuture<'a, Result<(), kube::Error>> {
        self.events.lock().unwrap().push(Notice {
            warning: e.type_.as_deref() == Some("Warning"),
            reason: e.reason.clone().unwrap_or_default(),
            action: e.action.clone().unwrap_or_default(),
            note: e.note.clone().unwrap_or_default(),
        });
        Box::pin(async { Ok(()) })
    }

    fn patch<'a>(
        &'a self,
        e: &'a k8s_openapi::api::events::v1::Event,
    ) -> futures::future::BoxFuture<'a, Result<(), kube::Error>> {
        self.create(e)
    }
}

fn cidr(name: &str, cidrs: &[&str], deleted_ago: Option<Duration>) -> ServiceCIDR {
    let mut o = service_cidr(name, cidrs.iter().copied());
    o.metadata.finalizers = Some(vec![FINALIZER.into()]);
    o.metadata.resource_version = Some("100".into());
    o.metadata.deletion_timestamp =
        deleted_ago.map(|d| Time(Timestamp::now() - jiff::SignedDuration::try_from(d).unwrap()));
    o
}

fn managed_ip(name: &str, service: &str) -> IPAddress {
    allocated_ip(name, "default", service)
}

fn syncer(
    w: Arc<Recorded>,
    dry_run: bool,
) -> (Worker<Arc<Recorded>>, Shared<CidrCache>, WorkQueue<String>) {
    let cache = Shared::<CidrCache>::default();
    let queue = WorkQueue::new(RateLimit::default());
    let events = events::Events::to(w.clone(), events::Reporter::on("test", "test"), dry_run);
    let s = Worker::new(
        cache.clone(),
        queue.clone(),
        w,
        Metrics::register(&prometheus::Registry::new()).unwrap(),
        dry_run,
        events,
    );
    (s, cache, queue)
}

const LONG_AGO: Option<Duration> = Some(Duration::from_secs(60));

#[tokio::test(start_paused = true)]
async fn removes_finalizer_when_nothing_is_orphaned() {
    let w = Arc::new(Recorded::default());
    let (s, cache, _) = syncer(w.clone(), false);
    cache
        .lock()
        .cidr_event(Event::Apply(cidr("x", &["10.0.1.0/24"], LONG_AGO)));
    s.sync("x").await.unwrap();
    assert_eq!(*w.calls.lock().unwrap(), vec!["remove-finalizer x at 100"]);
}

/// The removal is conditional on the version it was judged on: whatever version the cache
/// holds when the decision is made is the one the write names, and a 409 (the object changed
/// meanwhile) is an error that sends the key back, judged again on the newer view.
#[tokio::test(start_paused = true)]
async fn removal_names_the_judged_version_and_a_conflict_is_judged_again() {
    let w = Arc::new(Recorded {
        fail_remove: Some(409),
        ..Default::default()
    });
    let (s, cache, queue) = syncer(w.clone(), false);
    for rv in ["100", "7", "18446744073709551615"] {
        let mut o = cidr("x", &["10.0.1.0/24"], LONG_AGO);
        o.metadata.resource_version = Some(rv.into());
        cache.lock().cidr_event(Event::Apply(o));
        queue.add("x".into());
        assert!(s.process_next().await);
        assert_eq!(
            w.calls.lock().unwrap().last().unwrap(),
            &format!("remove-finalizer x at {rv}"),
            "the removal names the cached version {rv}"
        );
    }
    assert_eq!(
        s.metrics.sync_errors.with_label_values(&["conflict"]).get(),
        3,
        "each 409 is a failed sync"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(queue.len(), 1, "a conflict sends the key back to be judged");

    // A cached object without a version: no removal can be made conditional, none is made.
    let mut o = cidr("y", &["10.0.2.0/24"], LONG_AGO);
    o.metadata.resource_version = None;
    cache.lock().cidr_event(Event::Apply(o));
    let calls = w.calls.lock().unwrap().len();
    assert!(s.sync("y").await.is_err());
    assert_eq!(
        w.calls.lock().unwrap().len(),
        calls,
        "no unconditional removal"
    );
}

#[tokio::test(start_paused = true)]
async fn finalizer_stays_while_a_watch_is_failing_or_relisting() {
    let w = Arc::new(Recorded::default());
    let readiness = groundskeeper_plumbing::Readiness::default();
    let (cidrs, ips) = (
        readiness.register("servicecidr/servicecidrs"),
        readiness.register("servicecidr/ipaddresses"),
    );
    cidrs.mark_ready();
    ips.mark_ready();
    let (s, cache, queue) = syncer(w.clone(), false);
    let s = s.with_health(Health::new([cidrs.clone(), ips.clone()]));
    cache
        .lock()
        .cidr_event(Event::Apply(cidr("x", &["10.0.1.0/24"], LONG_AGO)));
    // The IPAddress watch fails (apiserver gone): an IP allocated meanwhile may be missing.
    ips.failed(&"connection refused", Duration::from_secs(1));
    s.sync("x").await.unwrap();
    ips.relist_started();
    s.sync("x").await.unwrap();
    assert!(w.calls.lock().unwrap().is_empty(), "{:?}", w.calls.lock());
    assert_eq!(queue.len(), 0, "rechecked after a delay, not at once");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(queue.len(), 1, "rechecked");
    ips.mark_ready();
    s.sync("x").await.unwrap();
    assert_eq!(*w.calls.lock().unwrap(), vec!["remove-finalizer x at 100"]);
}

#[tokio::test(start_paused = true)]
async fn dry_run_makes_no_writes() {
    let w = Arc::new(Recorded::default());
    let (s, cache, _) = syncer(w.clone(), true);
    {
        let mut c = cache.lock();
        c.cidr_event(Event::Apply(cidr("gone", &["10.0.1.0/24"], LONG_AGO)));
        let mut fresh = cidr("new", &["10.0.2.0/24"], None);
        fresh.metadata.finalizers = None;
        c.cidr_event(Event::Apply(fresh));
    }
    s.sync("gone").await.unwrap();
    s.sync("new").await.unwrap();
    assert!(
        w.calls.lock().unwrap().is_empty(),
        "{:?}",
        w.calls.lock().unwrap()
    );
}

/// Dry-run writes nothing at all: a blocked deletion is logged, and records no Event either.
#[tokio::test(start_paused = true)]
async fn dry_run_records_no_event() {
    let w = Arc::new(Recorded::default());
    let (s, cache, _) = syncer(w.clone(), true);
    {
        let mut c = cache.lock();
        c.cidr_event(Event::Apply(cidr("x", &["10.0.1.0/24"], LONG_AGO)));
        c.ip_event(Event::Apply(managed_ip("10.0.1.7", "web")));
    }
    s.sync("x").await.unwrap();
    assert!(w.calls.lock().unwrap().is_empty());
    assert!(
        w.events.lock().unwrap().is_empty(),
        "{:?}",
        w.events.lock().unwrap()
    );
    assert_eq!(
        s.metrics.blocked_deletions.get(),
        1,
        "the gauge still reports it"
    );
}

/// A ServiceCIDR `x` deleted long ago whose 10.0.1.7 (Service default/web) would be orphaned.
fn blocked_by_web() -> (Arc<Recorded>, Worker<Arc<Recorded>>, Shared<CidrCache>) {
    let w = Arc::new(Recorded::default());
    let (s, cache, _) = syncer(w.clone(), false);
    {
        let mut c = cache.lock();
        c.cidr_event(Event::Apply(cidr("x", &["10.0.1.0/24"], LONG_AGO)));
        c.ip_event(Event::Apply(managed_ip("10.0.1.7", "web")));
    }
    (w, s, cache)
}

/// What must not happen: the finalizer removed while an IP would be orphaned, through the
/// whole sync path; it goes only once the IP does.
#[tokio::test(start_paused = true)]
async fn blocked_deletion_names_ips_and_services_and_keeps_finalizer() {
    let (w, s, cache) = blocked_by_web();
    s.sync("x").await.unwrap();
    assert_eq!(*w.calls.lock().unwrap(), vec!["apply x False Terminating"]);
    let events = w.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, EVENT_DELETION_BLOCKED);
    assert!(events[0].warning);
    assert!(
        events[0].note.contains("10.0.1.7 (services default/web)"),
        "{}",
        events[0].note
    );
    assert_eq!(s.metrics.blocked_deletions.get(), 1);

    let keys = cache
        .lock()
        .ip_event(Event::Delete(managed_ip("10.0.1.7", "web")));
    assert_eq!(keys, vec!["x"]);
    s.sync("x").await.unwrap();
    assert_eq!(
        w.calls.lock().unwrap().last().unwrap(),
        "remove-finalizer x at 100"
    );
    assert_eq!(s.metrics.blocked_deletions.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn grace_period_requeues_without_api_calls() {
    let w = Arc::new(Recorded::default());
    let (s, cache, queue) = syncer(w.clone(), false);
    let four_s_ago = cidr("x", &["10.0.1.0/24"], Some(Duration::from_secs(4)));
    cache.lock().cidr_event(Event::Apply(four_s_ago));
    s.sync("x").await.unwrap();
    assert!(w.calls.lock().unwrap().is_empty());
    assert!(queue.is_empty());
    let start = tokio::time::Instant::now();
    assert_eq!(queue.get().await.as_deref(), Some("x"));
    let waited = start.elapsed();
    assert!(
        waited > Duration::from_secs(5) && waited <= Duration::from_secs(6),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn ready_failure_records_event_retries_then_drops() {
    let w = Arc::new(Recorded {
        fail_apply: Some(500),
        ..Default::default()
    });
    let (s, cache, queue) = syncer(w.clone(), false);
    cache
        .lock()
        .cidr_event(Event::Apply(cidr("x", &["10.0.1.0/24"], None)));
    queue.add("x".into());
    for _ in 0..=MAX_RETRIES {
        assert!(s.process_next().await);
    }
    assert_eq!(s.metrics.dropped_keys.get(), 1);
    assert_eq!(
        queue.num_requeues(&"x".to_string()),
        0,
        "forgotten after the drop"
    );
    assert_eq!(
        s.metrics.reconciles.with_label_values(&["error"]).get(),
        u64::from(MAX_RETRIES) + 1
    );
    assert_eq!(
        s.metrics
            .sync_errors
            .with_label_values(&["server_error"])
            .get(),
        u64::from(MAX_RETRIES) + 1
    );
    let events = w.events.lock().unwrap().clone();
    assert_eq!(events.len(), MAX_RETRIES as usize + 1);
    assert!(events.iter().all(|e| e.reason == EVENT_STATUS_ERROR
        && e.note == "The ServiceCIDR Status can not be set to Ready=True"));
    // Dropped: nothing comes back on its own.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(queue.is_empty());
}

#[tokio::test(start_paused = true)]
async fn vanished_cidr_is_a_no_op() {
    let w = Arc::new(Recorded::default());
    let (s, _, _) = syncer(w.clone(), false);
    s.sync("nope").await.unwrap();
    assert!(w.calls.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn foreign_status_apply_is_counted_once() {
    let w = Arc::new(Recorded::default());
    let (s, cache, _) = syncer(w.clone(), false);
    let mut o = cidr("x", &["10.0.1.0/24"], None);
    o.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some(KCM_FIELD_MANAGER.into()),
        operation: Some("Apply".into()),
        subresource: Some("status".into()),
        time: Some(Time(Timestamp::now() + jiff::SignedDuration::from_secs(1))),
        fields_v1: Some(FieldsV1(serde_json::json!({"f:status": {}}))),
        ..Default::default()
    }]);
    cache.lock().cidr_event(Event::Apply(o));
    s.sync("x").await.unwrap();
    s.sync("x").await.unwrap();
    assert_eq!(
        s.metrics
            .foreign_writes
            .with_label_values(&["status_apply"])
            .get(),
        1
    );
    assert_eq!(s.metrics.conflicting_controller.get(), 1);
}

/// One decision, one write: a sync that runs on the object our finalizer patch produced
/// (resourceVersion 101), before the event of our Ready apply (102) arrived, writes nothing;
/// once the cache holds 102, or a change of someone else's, it decides again.
#[tokio::test(start_paused = true)]
async fn a_cache_behind_our_own_writes_repeats_none_of_them() {
    let w = Arc::new(Recorded::default());
    let (s, cache, _) = syncer(w.clone(), false);
    let mut fresh = service_cidr("x", ["10.0.1.0/24"]);
    fresh.metadata.resource_version = Some("100".into());
    cache.lock().cidr_event(Event::Apply(fresh.clone()));
    s.sync("x").await.unwrap();
    assert_eq!(
        *w.calls.lock().unwrap(),
        vec!["add-finalizer x", "apply x True "]
    );

    // The event of our finalizer patch: the finalizer, not yet the Ready condition.
    let mut ours = fresh.clone();
    ours.metadata.resource_version = Some("101".into());
    ours.metadata.finalizers = Some(vec![FINALIZER.into()]);
    cache.lock().cidr_event(Event::Apply(ours.clone()));
    s.sync("x").await.unwrap();
    assert_eq!(
        w.calls.lock().unwrap().len(),
        2,
        "a write repeated on a stale cache"
    );

    // Someone else's change (a new resourceVersion) is decided on as usual.
    let mut theirs = ours.clone();
    theirs.metadata.resource_version = Some("150".into());
    cache.lock().cidr_event(Event::Apply(theirs));
    s.sync("x").await.unwrap();
    assert_eq!(
        w.calls.lock().unwrap().last().unwrap(),
        "apply x True ",
        "the Ready condition is still missing there: applied again"
    );
}

/// The blocked deletion is reported (log and Event) once per set of blockers, not once per
/// sync that finds the same ones again; a changed set is reported again.
#[tokio::test(start_paused = true)]
async fn a_blocked_deletion_is_reported_once_per_set_of_blockers() {
    let (w, s, cache) = blocked_by_web();
    s.sync("x").await.unwrap();
    s.sync("x").await.unwrap();
    assert_eq!(w.events.lock().unwrap().len(), 1);
    cache
        .lock()
        .ip_event(Event::Apply(managed_ip("10.0.1.8", "api")));
    s.sync("x").await.unwrap();
    let events = w.events.lock().unwrap().clone();
    assert_eq!(events.len(), 2);
    assert!(events[1].note.contains("10.0.1.8"), "{}", events[1].note);
    assert_eq!(s.metrics.blocked_deletions.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_sync_is_counted_under_what_the_apiserver_answered() {
    for (code, want) in [
        (403, "forbidden"),
        (409, "conflict"),
        (429, "too_many_requests"),
        (503, "server_error"),
        (422, "other"),
    ] {
        let w = Arc::new(Recorded {
            fail_apply: Some(code),
            ..Default::default()
        });
        let (s, cache, queue) = syncer(w, false);
        cache
            .lock()
            .cidr_event(Event::Apply(cidr("x", &["10.0.1.0/24"], None)));
        queue.add("x".into());
        assert!(s.process_next().await);
        for label in groundskeeper_plumbing::client::API_ERROR_LABELS {
            assert_eq!(
                s.metrics.sync_errors.with_label_values(&[label]).get(),
                u64::from(label == want),
                "HTTP {code}: {label}"
            );
        }
    }
}
