//! The Event writer: series, once-only Events, dry-run, the fence, and the API calls it makes.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;

use crate::events::*;

fn on(kind: &str, ns: Option<&str>, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(kind.into()),
        namespace: ns.map(Into::into),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

fn notice(reason: &str, note: &str, regarding: ObjectReference, repeat: Repeat) -> Notice {
    Notice {
        severity: Severity::Warning,
        reason: reason.into(),
        action: "Observe".into(),
        note: note.into(),
        regarding,
        repeat,
    }
}

fn writer(dry_run: bool) -> (Arc<Recording>, Events) {
    let sink = Arc::new(Recording::default());
    let events = Events::to(sink.clone(), Reporter::on("gk", "node-a"), dry_run);
    (sink, events)
}

/// splitmix64, so a failing seed can be replayed.
fn rng(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut s = seed;
    move |n| {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// Within the TTL, each distinct Event is created once and every repeat counts in its series;
/// `SeriesPerNote` tells notes apart, `Series` does not.
#[tokio::test(start_paused = true)]
async fn a_repeat_joins_the_series_of_the_same_event() {
    for seed in 0..50 {
        let mut next = rng(seed);
        let (sink, events) = writer(false);
        let mut seen: std::collections::HashMap<(u64, u64, Option<u64>), i32> = Default::default();
        for _ in 0..40 {
            let (reason, object, note, per_note) = (next(2), next(3), next(3), next(2) == 0);
            let n = notice(
                &format!("R{reason}"),
                &format!("note {note}"),
                on("Node", None, &format!("n{object}")),
                if per_note {
                    Repeat::SeriesPerNote
                } else {
                    Repeat::Series
                },
            );
            let key = (
                reason * 2 + u64::from(per_note),
                object,
                per_note.then_some(note),
            );
            let count = seen.entry(key).or_default();
            *count += 1;
            let want = if *count == 1 {
                Recorded::Created
            } else {
                Recorded::Repeated(*count)
            };
            assert_eq!(events.publish(&n).await.unwrap(), want, "seed {seed}");
            let last = sink.take().pop().expect("one write per publish");
            assert_eq!(
                last.series.as_ref().map(|s| s.count),
                (*count > 1).then_some(*count),
                "seed {seed}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_repeat_after_the_ttl_is_a_new_event() {
    let (sink, events) = writer(false);
    let n = notice("R", "x", on("Node", None, "n"), Repeat::Series);
    assert_eq!(events.publish(&n).await.unwrap(), Recorded::Created);
    tokio::time::advance(SERIES_TTL - Duration::from_secs(1)).await;
    assert_eq!(events.publish(&n).await.unwrap(), Recorded::Repeated(2));
    tokio::time::advance(SERIES_TTL).await;
    assert_eq!(events.publish(&n).await.unwrap(), Recorded::Created);
    let written = sink.take();
    assert_eq!(written.len(), 3);
    assert_eq!(
        written[0].metadata.name, written[1].metadata.name,
        "patched"
    );
    assert_eq!(written[0].reporting_controller.as_deref(), Some("gk"));
    assert_eq!(written[0].reporting_instance.as_deref(), Some("node-a"));
    assert_eq!(
        written[0].metadata.namespace.as_deref(),
        Some("default"),
        "a cluster-scoped object's Events go to default"
    );
}

#[tokio::test]
async fn once_named_is_created_once_even_by_another_process() {
    let (sink, events) = writer(false);
    let n = notice(
        "Forbidden",
        "x",
        on("Pod", Some("ns"), "web"),
        Repeat::Once("web.abc".into()),
    );
    assert_eq!(events.publish(&n).await.unwrap(), Recorded::Created);
    let made = sink.take();
    assert_eq!(made[0].metadata.name.as_deref(), Some("web.abc"));
    assert_eq!(made[0].metadata.namespace.as_deref(), Some("ns"));
    sink.failures.lock().unwrap().push_back(409);
    assert_eq!(events.publish(&n).await.unwrap(), Recorded::AlreadyThere);
    sink.failures.lock().unwrap().push_back(500);
    assert!(
        events.publish(&n).await.is_err(),
        "other errors are the caller's"
    );
}

#[tokio::test]
async fn dry_run_writes_nothing() {
    let (sink, events) = writer(true);
    for repeat in [
        Repeat::Series,
        Repeat::SeriesPerNote,
        Repeat::Once("x".into()),
    ] {
        let n = notice("R", "x", on("Node", None, "n"), repeat);
        assert_eq!(events.publish(&n).await.unwrap(), Recorded::DryRun);
        assert_eq!(events.publish_logged(&n).await.unwrap(), Recorded::DryRun);
    }
    assert!(sink.take().is_empty());
}

/// A fence that refuses every write (a replica that is not leading).
struct Refuses;

impl Fence for Refuses {
    fn guard<'a>(
        &'a self,
        _write: BoxFuture<'a, Result<(), kube::Error>>,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async {
            Err(kube::Error::Service(
                std::io::Error::other("not leading").into(),
            ))
        })
    }
}

#[tokio::test]
async fn a_fenced_writer_writes_only_through_its_fence() {
    let (sink, events) = writer(false);
    let events = events.fenced(Arc::new(Refuses));
    let n = notice("R", "x", on("Node", None, "n"), Repeat::Series);
    let e = events.publish(&n).await.unwrap_err();
    assert!(e.to_string().contains("not leading"), "{e}");
    assert!(sink.take().is_empty());
    // Not remembered as recorded: the next one is created, not patched.
    let events = Events::to(sink.clone(), Reporter::on("gk", "a"), false);
    assert_eq!(events.publish(&n).await.unwrap(), Recorded::Created);
}

#[tokio::test]
async fn the_api_gets_a_create_then_a_series_patch() {
    let calls = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = calls.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        log.lock()
            .unwrap()
            .push(format!("{} {}", req.method(), req.uri().path()));
        async move {
            let body = serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "n.1", "namespace": "ns"}, "eventTime": null});
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(200)
                    .body(kube::client::Body::from(body.to_string().into_bytes()))
                    .unwrap(),
            )
        }
    });
    let client = kube::Client::new(service, "default");
    let events = Events::new(client, Reporter::in_pod("gk"), false);
    let n = notice("R", "x", on("Pod", Some("ns"), "web"), Repeat::Series);
    events.publish(&n).await.unwrap();
    events.publish(&n).await.unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0], "POST /apis/events.k8s.io/v1/namespaces/ns/events");
    assert!(
        calls[1].starts_with("PATCH /apis/events.k8s.io/v1/namespaces/ns/events/web."),
        "{calls:?}"
    );
}

/// The one scheme, and the apiserver's rule for a reportingController (a qualified name),
/// over names that pass and names that must not: the binaries' tests hold every component's
/// reporter to it.
#[test]
fn reporting_controllers_follow_one_scheme() {
    for good in [
        "podgc",
        "servicecidr",
        "sysctlplacement",
        "conntrack",
        "a",
        "a.b_c-d",
    ] {
        let name = reporting_controller(good);
        assert!(is_reporting_controller(&name), "{name}");
    }
    assert_eq!(reporting_controller("podgc"), "groundskeeper.dev/podgc");
    for bad in [
        "service-cidr-controller",
        "groundskeeper-node-agent",
        "groundskeeper.dev/",
        "groundskeeper.dev/-podgc",
        "groundskeeper.dev/podgc-",
        "groundskeeper.dev/pod gc",
        "groundskeeper.dev/pod/gc",
        "example.com/podgc",
        "groundskeeper.devx/podgc",
    ] {
        assert!(!is_reporting_controller(bad), "{bad}");
    }
    assert!(!is_reporting_controller(&reporting_controller(
        &"a".repeat(64)
    )));
    assert!(is_reporting_controller(&reporting_controller(
        &"a".repeat(63)
    )));
}
