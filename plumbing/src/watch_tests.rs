//! Tests of `watch.rs` against scripted apiservers: backoff, relists, unanswered lists, and
//! watches that go silent.

use std::{
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt};
use kube::{
    Api,
    runtime::watcher::{self, Event},
};
use tokio::time::Instant;

use crate::watch::*;

#[test]
fn a_missing_resource_is_explained() {
    let err = |code| {
        watcher::Error::InitialListFailed(kube::Error::Api(
            kube::core::Status::failure(
                "the server could not find the requested resource",
                "NotFound",
            )
            .with_code(code)
            .boxed(),
        ))
    };
    let text = Explained(&err(404)).to_string();
    assert!(text.contains("is its CRD installed?"), "{text}");
    let text = Explained(&err(500)).to_string();
    assert!(!text.contains("CRD"), "{text}");
}

#[test]
fn backoff_is_capped_jittered_and_reset() {
    let mut b = Backoff::new(Duration::from_secs(2));
    let first = b.next_delay();
    assert!(
        first >= Duration::from_millis(100) && first <= BACKOFF_MIN,
        "{first:?}"
    );
    for _ in 0..20 {
        let d = b.next_delay();
        assert!(d <= Duration::from_secs(2), "{d:?}");
    }
    let late = b.next_delay();
    assert!(
        late >= Duration::from_secs(1),
        "at the cap, jitter halves at most: {late:?}"
    );
    b.reset();
    assert!(b.next_delay() <= BACKOFF_MIN);
    let tiny = Backoff::new(Duration::from_millis(50)).next_delay();
    assert!(
        tiny <= Duration::from_millis(50),
        "a cap below the minimum wins"
    );
}

/// A fake apiserver: lists return one ConfigMap (a, then b), the first watch answers 410
/// Gone as the apiserver does when the resourceVersion was compacted away.
fn fake_apiserver(lists: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> kube::Client {
    use kube::client::Body;
    use std::sync::atomic::Ordering;
    let service = tower::service_fn(move |req: http::Request<Body>| {
        let lists = lists.clone();
        async move {
            let watch = req.uri().query().is_some_and(|q| q.contains("watch=true"));
            let body = if watch {
                serde_json::json!({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "reason": "Expired", "code": 410,
                    "message": "too old resource version: 1 (20)"}})
                .to_string()
                    + "\n"
            } else {
                let n = lists.fetch_add(1, Ordering::SeqCst);
                let name = if n == 0 { "a" } else { "b" };
                serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
                    "metadata": {"resourceVersion": "1"},
                    "items": [{"metadata": {"name": name, "namespace": "default",
                                            "resourceVersion": "1"}}]})
                .to_string()
            };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(200)
                    .body(Body::from(body.into_bytes()))
                    .unwrap(),
            )
        }
    });
    kube::Client::new(service, "default")
}

#[tokio::test]
async fn a_410_gone_turns_the_watch_unhealthy_and_relists_after_a_short_backoff() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    let lists = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let readiness = crate::Readiness::default();
    let registry = prometheus::Registry::new();
    registry.register(readiness.collector()).unwrap();
    let flag = readiness.register("test/configmaps");
    let client = fake_apiserver(lists.clone());
    let mut stream = std::pin::pin!(watch::<ConfigMap>(
        client,
        Api::all,
        watcher::Config::default(),
        flag.clone()
    ));
    let mut next = async || match stream.next().await {
        Some(Ok(Event::Init)) => "init".to_string(),
        Some(Ok(Event::InitApply(o))) => format!("init-apply {}", o.name_any()),
        Some(Ok(Event::InitDone)) => "init-done".to_string(),
        other => format!("unexpected {other:?}"),
    };
    assert_eq!(next().await, "init");
    assert_eq!(next().await, "init-apply a");
    assert_eq!(next().await, "init-done");
    assert!(
        !flag.is_ready(),
        "marked only once the consumer comes back, i.e. has applied the list"
    );
    let started = std::time::Instant::now();
    // Asking for the next event marks the list applied; the watch then gets its 410.
    assert_eq!(next().await, "init");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(
        flag.is_ready(),
        "the first list counts for start-up readiness"
    );
    assert!(!flag.is_healthy(), "failed, relisting");
    assert_eq!(next().await, "init-apply b");
    assert_eq!(next().await, "init-done");
    assert_eq!(lists.load(std::sync::atomic::Ordering::SeqCst), 2);
    flag.mark_ready();
    assert!(flag.is_healthy());
    let text = crate::metrics::render(&registry);
    assert!(
        text.contains("groundskeeper_watch_errors_total{watch=\"test/configmaps\"} 1"),
        "{text}"
    );
}

/// What must NOT happen: lists that succeed while every watch is refused relisting at the
/// shortest delay for ever. The backoff grows to its cap instead.
#[tokio::test(start_paused = true)]
async fn a_watch_refused_after_every_good_list_backs_off_to_the_cap() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let lists = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flag = crate::Readiness::default().register("test/configmaps");
    let client = fake_apiserver(lists.clone());
    let stream = watch::<ConfigMap>(client, Api::all, watcher::Config::default(), flag);
    let mut stream = std::pin::pin!(stream);
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        stream.next().await;
    }
    let n = lists.load(std::sync::atomic::Ordering::SeqCst);
    // 0.2, 0.4, 0.8, 1.6, then 2 s (each jittered down to half at most): about 10-20
    // lists in 20 s. Resetting after each good list made it about 130.
    assert!((8..=25).contains(&n), "{n} lists in 20 s");
}

/// A body fed chunk by chunk, ending when the sender is dropped: a watch stream.
struct Chunks(tokio::sync::mpsc::UnboundedReceiver<bytes::Bytes>);

impl http_body::Body for Chunks {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|c| c.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// Lists answer one ConfigMap; each watch stays open, sending a bookmark every `bookmarks`
/// (never, if `None`). Records every request's query.
fn quiet_apiserver(bookmarks: Option<Duration>, queries: Arc<Mutex<Vec<String>>>) -> kube::Client {
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let query = req.uri().query().unwrap_or_default().to_string();
        queries.lock().unwrap().push(query.clone());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if query.contains("watch=true") {
            tokio::spawn(async move {
                loop {
                    let Some(every) = bookmarks else {
                        // Open and silent: the sender lives as long as the stream is read.
                        tx.closed().await;
                        return;
                    };
                    tokio::time::sleep(every).await;
                    let bm = serde_json::json!({"type": "BOOKMARK", "object": {
                        "kind": "ConfigMap", "apiVersion": "v1",
                        "metadata": {"resourceVersion": "2"}}});
                    if tx.send(format!("{bm}\n").into_bytes().into()).is_err() {
                        return;
                    }
                }
            });
        } else {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
                "metadata": {"resourceVersion": "1"},
                "items": [{"metadata": {"name": "a", "namespace": "default",
                                        "resourceVersion": "1"}}]});
            tx.send(list.to_string().into_bytes().into()).unwrap();
        }
        async move {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(200)
                    .body(Chunks(rx))
                    .unwrap(),
            )
        }
    });
    kube::Client::new(service, "default")
}

fn silent_after_10s() -> crate::Readiness {
    crate::Readiness::new(crate::WatchSettings {
        silent_after: Duration::from_secs(10),
        ..Default::default()
    })
}

/// Drives `stream` until it yields `InitDone` for the `n`th time; the events seen.
async fn until_listed<S>(stream: &mut Pin<&mut S>) -> Vec<String>
where
    S: Stream<Item = watcher::Result<Event<k8s_openapi::api::core::v1::ConfigMap>>>,
{
    let mut seen = Vec::new();
    loop {
        match stream.next().await {
            Some(Ok(Event::InitDone)) => return seen,
            Some(Ok(Event::Init)) => seen.push("init".into()),
            Some(Ok(Event::InitApply(_))) => seen.push("init-apply".into()),
            other => seen.push(format!("{other:?}")),
        }
    }
}

/// The connection stays up and nothing comes through it, not even a bookmark: the watch
/// is failed, counted and relisted once the bound has passed, not after kube-runtime's
/// 295 s (which then resumed without a word).
#[tokio::test(start_paused = true)]
async fn a_watch_silent_past_the_bound_is_failed_and_relisted() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let queries = Arc::new(Mutex::new(Vec::new()));
    let readiness = silent_after_10s();
    let registry = prometheus::Registry::new();
    registry.register(readiness.collector()).unwrap();
    let flag = readiness.register("test/configmaps");
    let client = quiet_apiserver(None, queries.clone());
    let stream = watch::<ConfigMap>(client, Api::all, watcher::Config::default(), flag.clone());
    let mut stream = std::pin::pin!(stream);
    until_listed(&mut stream).await;
    let listed = Instant::now();
    let relist = tokio::time::timeout(Duration::from_secs(120), until_listed(&mut stream))
        .await
        .expect("relisted within the bound");
    assert_eq!(relist[0], "init", "{relist:?}");
    let took = listed.elapsed();
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(11),
        "{took:?}"
    );
    let text = crate::metrics::render(&registry);
    assert!(
        text.contains("groundskeeper_watch_errors_total{watch=\"test/configmaps\"} 1"),
        "{text}"
    );
    let queries = queries.lock().unwrap();
    let watches: Vec<_> = queries
        .iter()
        .filter(|q| q.contains("watch=true"))
        .collect();
    assert!(
        watches
            .iter()
            .all(|q| q.contains("allowWatchBookmarks=true") && q.contains("timeoutSeconds=5")),
        "bookmarks asked for, and an end every half bound: {watches:?}"
    );
}

/// What must NOT happen: a quiet watch whose bookmarks arrive (kube-runtime keeps them to
/// itself) failed for want of events.
#[tokio::test(start_paused = true)]
async fn bookmarks_keep_a_quiet_watch_alive() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let queries = Arc::new(Mutex::new(Vec::new()));
    let readiness = silent_after_10s();
    let flag = readiness.register("test/configmaps");
    let client = quiet_apiserver(Some(Duration::from_secs(4)), queries.clone());
    let stream = watch::<ConfigMap>(client, Api::all, watcher::Config::default(), flag.clone());
    let mut stream = std::pin::pin!(stream);
    until_listed(&mut stream).await;
    let more = tokio::time::timeout(Duration::from_secs(120), stream.next()).await;
    assert!(more.is_err(), "nothing but bookmarks: {more:?}");
    assert!(flag.is_healthy());
    assert_eq!(flag.stale_for(), Duration::ZERO);
    let lists = queries
        .lock()
        .unwrap()
        .iter()
        .filter(|q| !q.contains("watch=true"))
        .count();
    assert_eq!(lists, 1, "never relisted");
}

#[test]
fn a_bound_under_the_bookmark_period_asks_watches_to_end_every_half_of_it() {
    let s = Duration::from_secs;
    for (bound, preset, want) in [
        (None, None, None),
        (Some(s(90)), None, None),
        (Some(s(70)), None, None),
        (Some(s(60)), None, Some(30)),
        (Some(s(10)), None, Some(5)),
        (Some(s(6)), None, Some(3)),
        (Some(s(10)), Some(2), Some(2)),
    ] {
        let mut config = watcher::Config::default().disable_bookmarks();
        config.timeout = preset;
        let config = with_bookmarks(config, bound);
        assert!(config.bookmarks, "{bound:?}");
        assert_eq!(config.timeout, want, "{bound:?} {preset:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_list_left_unanswered_is_asked_again() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::client::Body;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let lists = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = lists.clone();
    // The first list is held for ever, as a starting apiserver holds early requests.
    let service = tower::service_fn(move |_req: http::Request<Body>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                std::future::pending::<()>().await;
            }
            let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
                "metadata": {"resourceVersion": "1"}, "items": []})
            .to_string();
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(200)
                    .body(Body::from(body.into_bytes()))
                    .unwrap(),
            )
        }
    });
    let flag = crate::Readiness::default().register("test/configmaps");
    let client = kube::Client::new(service, "default");
    let mut stream = std::pin::pin!(watch::<ConfigMap>(
        client,
        Api::all,
        watcher::Config::default(),
        flag.clone()
    ));
    let started = tokio::time::Instant::now();
    assert!(matches!(stream.next().await, Some(Ok(Event::Init))));
    assert!(
        matches!(stream.next().await, Some(Ok(Event::Init))),
        "asked again"
    );
    assert!(matches!(stream.next().await, Some(Ok(Event::InitDone))));
    let took = started.elapsed();
    assert!(
        took >= LIST_DEADLINE && took <= LIST_DEADLINE + Duration::from_millis(50),
        "{took:?}"
    );
    assert_eq!(lists.load(Ordering::SeqCst), 2);
}
