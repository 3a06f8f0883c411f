//! Tests of `stream.rs` against scripted apiservers: backoff, relists, unanswered lists, and
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

use crate::watch::stream::*;

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
    let readiness = crate::Readiness::new(paged());
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
    let flag = crate::Readiness::new(paged()).register("test/configmaps");
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

/// The fake apiserver here serves paged lists only.
fn paged() -> crate::WatchSettings {
    crate::WatchSettings {
        list: crate::watch::list::WatchList::Off,
        ..Default::default()
    }
}

fn silent_after_10s() -> crate::Readiness {
    crate::Readiness::new(crate::WatchSettings {
        silent_after: Duration::from_secs(10),
        ..paged()
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

/// What one watch request of [`scripted_apiserver`] gets.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// Never answered (a request on a dead connection).
    Unanswered,
    /// Answered, then nothing at all, and never ended (a stuck proxy).
    Stuck,
    /// Answered; each line after its delay (from the answer), then ended at the request's
    /// `timeoutSeconds` as the apiserver ends it (never, without one).
    Live(&'static [(u64, Line)]),
}

#[derive(Clone, Copy, Debug)]
enum Line {
    Bookmark(&'static str),
    Added(&'static str, &'static str),
    /// 410 Gone: the resourceVersion was compacted away.
    Gone,
}

impl Line {
    /// As the apiserver writes it: `type` first (serde_json would sort it after `object`).
    fn json(self) -> String {
        let (kind, object) = match self {
            Line::Bookmark(rv) => (
                "BOOKMARK",
                serde_json::json!({
                "kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}),
            ),
            Line::Added(name, rv) => (
                "ADDED",
                serde_json::json!({
                "kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": "default", "resourceVersion": rv}}),
            ),
            Line::Gone => (
                "ERROR",
                serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": "Expired", "code": 410, "message": "too old resource version"}),
            ),
        };
        format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n")
    }
}

/// Lists answer one ConfigMap at resourceVersion 1; the nth watch request plays `scripts[n]`
/// (`Live(&[])` past the end: a quiet kind on a live apiserver, which sends no bookmark).
/// Records every request's query.
fn scripted_apiserver(scripts: Vec<Script>, queries: Arc<Mutex<Vec<String>>>) -> kube::Client {
    let watches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let query = req.uri().query().unwrap_or_default().to_string();
        queries.lock().unwrap().push(query.clone());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<bytes::Bytes>();
        let mut answered = true;
        if query.contains("watch=true") {
            let n = watches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let script = scripts.get(n).copied().unwrap_or(Script::Live(&[]));
            answered = !matches!(script, Script::Unanswered);
            let timeout = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("timeoutSeconds="))
                .map(|t| Duration::from_secs(t.parse().unwrap()));
            tokio::spawn(async move {
                let start = Instant::now();
                let Script::Live(lines) = script else {
                    // Open and silent: the sender lives as long as the stream is read.
                    tx.closed().await;
                    return;
                };
                let run = async {
                    for (after, line) in lines {
                        tokio::time::sleep_until(start + Duration::from_secs(*after)).await;
                        if tx.send(line.json().into_bytes().into()).is_err() {
                            return;
                        }
                    }
                    tx.closed().await;
                };
                match timeout {
                    // Dropping the sender ends the body: the server's clean end.
                    Some(t) => drop(tokio::time::timeout(t, run).await),
                    None => run.await,
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
            if !answered {
                std::future::pending::<()>().await;
            }
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

/// The bound of most of these tests: each watch is asked to end after 4 s, and kube-runtime's
/// own idle timeout (that plus 5 s) comes after the bound, so a stuck stream stays stuck until
/// the bound. (With longer bounds kube-runtime re-watches a stuck stream itself first.)
const BOUND: Duration = Duration::from_secs(8);

fn readiness_at(bound: Duration) -> crate::Readiness {
    crate::Readiness::new(crate::WatchSettings {
        silent_after: bound,
        ..paged()
    })
}

fn readiness() -> crate::Readiness {
    readiness_at(BOUND)
}

/// A watch driven by a task of its own, as a component drives it: each event is "applied" at
/// once and described on the channel.
fn driven(
    scripts: Vec<Script>,
    queries: Arc<Mutex<Vec<String>>>,
    readiness: &crate::Readiness,
) -> (
    crate::ReadyFlag,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    let flag = readiness.register("test/configmaps");
    let client = scripted_apiserver(scripts, queries);
    let stream = watch::<ConfigMap>(client, Api::all, watcher::Config::default(), flag.clone());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let said = match ev {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitApply(o)) => format!("init-apply {}", o.name_any()),
                Ok(Event::InitDone) => "init-done".to_string(),
                Ok(Event::Apply(o)) => format!("apply {}", o.name_any()),
                Ok(Event::Delete(o)) => format!("delete {}", o.name_any()),
                Err(e) => format!("error {e}"),
            };
            if tx.send(said).is_err() {
                return;
            }
        }
    });
    (flag, rx)
}

fn lists(queries: &Mutex<Vec<String>>) -> usize {
    let q = queries.lock().unwrap();
    q.iter().filter(|q| !q.contains("watch=true")).count()
}

fn watches(queries: &Mutex<Vec<String>>) -> Vec<String> {
    let q = queries.lock().unwrap();
    q.iter()
        .filter(|q| q.contains("watch=true"))
        .cloned()
        .collect()
}

async fn until(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, what: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let ev = rx.recv().await.expect("the watch task runs");
        let done = ev == what;
        seen.push(ev);
        if done {
            return seen;
        }
    }
}

fn errors(registry: &prometheus::Registry) -> String {
    let text = crate::metrics::render(registry);
    text.lines()
        .find(|l| l.starts_with("groundskeeper_watch_errors_total{watch=\"test/configmaps\"}"))
        .unwrap_or_default()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Why quiet watches relisted at 150k pods: the apiserver sends no bookmark on a kind nobody writes
/// (etcd without progress requests), so a watch alive but quiet must still be heard from within
/// the bound. Each is asked to end after half of it and, watched again from its
/// resourceVersion, answers: never failed, never relisted. (Before: failed at the bound and
/// relisted, every bound.)
#[tokio::test(start_paused = true)]
async fn a_quiet_watch_without_bookmarks_is_never_failed_nor_relisted() {
    let queries = Arc::new(Mutex::new(Vec::new()));
    let bound = Duration::from_secs(80);
    let readiness = readiness_at(bound);
    let registry = prometheus::Registry::new();
    registry.register(readiness.collector()).unwrap();
    // The first watch is stuck: kube-runtime ends it after its idle timeout (45 s), within the
    // bound, and watches again from the same version: not a silence either.
    let (flag, mut rx) = driven(vec![Script::Stuck], queries.clone(), &readiness);
    until(&mut rx, "init-done").await;
    for _ in 0..20 {
        tokio::time::sleep(bound / 2).await;
        assert!(flag.is_healthy());
    }
    assert_eq!(errors(&registry), "0");
    assert_eq!(lists(&queries), 1, "never relisted");
    let w = watches(&queries);
    assert!(w.len() >= 20, "{w:?}");
    assert!(
        w.iter().all(|q| q.contains("timeoutSeconds=40")
            && q.contains("allowWatchBookmarks=true")
            && q.contains("resourceVersion=1")),
        "each asked to end after half the bound, from the list's version: {w:?}"
    );
}

/// The rule after a silence: the watch is failed (nothing destructive may act) and re-opened
/// from its last resourceVersion, with no list; it is healthy again once a bookmark comes
/// through the new watch, and goes on from that bookmark's version.
#[tokio::test(start_paused = true)]
async fn a_silent_watch_is_failed_and_rewatched_from_its_last_resource_version() {
    let queries = Arc::new(Mutex::new(Vec::new()));
    let readiness = readiness();
    let registry = prometheus::Registry::new();
    registry.register(readiness.collector()).unwrap();
    let scripts = vec![Script::Stuck, Script::Live(&[(3, Line::Bookmark("7"))])];
    let (flag, mut rx) = driven(scripts, queries.clone(), &readiness);
    let health = crate::watch::cache::Health::new([flag.clone()]);
    until(&mut rx, "init-done").await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(flag.is_healthy());
    let seen = health.seen();
    assert_eq!(health.may_act(&seen), Ok(()));

    // Just past the bound: failed, already re-watching, not relisting.
    tokio::time::sleep(BOUND + Duration::from_secs(1)).await;
    assert!(!flag.is_healthy(), "silent past the bound");
    assert_eq!(
        health.may_act(&seen),
        Err(crate::watch::cache::Stale::NotHealthy)
    );
    assert_eq!(
        health.may_act(&health.seen()),
        Err(crate::watch::cache::Stale::NotHealthy),
        "nor on anything read now"
    );
    assert_eq!(errors(&registry), "1", "the silence is counted");
    let w = watches(&queries);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[1].contains("resourceVersion=1"),
        "from the list's version: {w:?}"
    );
    assert_eq!(lists(&queries), 1, "re-watched, not relisted");
    // The re-watch is answered but says nothing for 3 s: still blocked.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!flag.is_healthy(), "answered is not proved");
    assert_eq!(
        health.may_act(&health.seen()),
        Err(crate::watch::cache::Stale::NotHealthy)
    );
    // The bookmark comes: healthy again; what was read before the silence stays stale.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(flag.is_healthy(), "the bookmark proves the re-watch");
    assert_eq!(
        health.may_act(&seen),
        Err(crate::watch::cache::Stale::ChangedSince)
    );
    assert_eq!(health.may_act(&health.seen()), Ok(()));
    assert!(
        rx.try_recv().is_err(),
        "nothing handed out: no init, no relist"
    );

    // The re-watch ends at its timeout; the next one goes on from the bookmark's version.
    tokio::time::sleep(BOUND).await;
    assert!(flag.is_healthy());
    let w = watches(&queries);
    assert!(w.len() >= 3, "{w:?}");
    assert!(
        w[2].contains("resourceVersion=7"),
        "from the bookmark's version: {w:?}"
    );
    assert_eq!(lists(&queries), 1, "never relisted");
    assert_eq!(errors(&registry), "1");
}

/// Without bookmarks (a quiet kind), a re-watch proves itself by its first event, once that
/// is applied, or by being ended by the server: it delivered everything before its end.
#[tokio::test(start_paused = true)]
async fn a_rewatch_is_proved_by_an_event_or_by_its_end() {
    for (second, proved_after) in [
        (Script::Live(&[(2, Line::Added("b", "8"))]), 2),
        (Script::Live(&[]), 4),
    ] {
        let queries = Arc::new(Mutex::new(Vec::new()));
        let readiness = readiness();
        let (flag, mut rx) = driven(vec![Script::Stuck, second], queries.clone(), &readiness);
        until(&mut rx, "init-done").await;
        tokio::time::sleep(BOUND + Duration::from_millis(500)).await;
        assert!(!flag.is_healthy(), "{second:?}");
        tokio::time::sleep(Duration::from_secs(proved_after - 1)).await;
        assert!(!flag.is_healthy(), "{second:?}: not yet proved");
        tokio::time::sleep(Duration::from_secs(1)).await;
        if proved_after == 2 {
            assert_eq!(rx.recv().await.as_deref(), Some("apply b"), "replayed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(flag.is_healthy(), "{second:?}");
        assert_eq!(lists(&queries), 1, "{second:?}: never relisted");
    }
}

/// What forces a relist after a silence: the re-watch answered 410 Gone. Unhealthy all along,
/// until the relist is applied.
#[tokio::test(start_paused = true)]
async fn a_rewatch_answered_410_relists() {
    let queries = Arc::new(Mutex::new(Vec::new()));
    let readiness = readiness();
    let scripts = vec![Script::Stuck, Script::Live(&[(1, Line::Gone)])];
    let (flag, mut rx) = driven(scripts, queries.clone(), &readiness);
    until(&mut rx, "init-done").await;
    tokio::time::sleep(BOUND + Duration::from_millis(500)).await;
    assert!(!flag.is_healthy());
    assert_eq!(lists(&queries), 1, "re-watching first");
    let relist = until(&mut rx, "init-done").await;
    assert!(relist.contains(&"init".to_string()), "{relist:?}");
    assert_eq!(lists(&queries), 2);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(flag.is_healthy());
}

/// A re-watch that is never answered (a dead connection) is dropped at the next silence and
/// asked again from the same version: still no list, healthy once the new one proves itself.
#[tokio::test(start_paused = true)]
async fn a_rewatch_left_unanswered_is_dropped_and_asked_again_from_the_same_version() {
    let queries = Arc::new(Mutex::new(Vec::new()));
    let readiness = readiness();
    let scripts = vec![Script::Stuck, Script::Unanswered];
    let (flag, mut rx) = driven(scripts, queries.clone(), &readiness);
    until(&mut rx, "init-done").await;
    tokio::time::sleep(2 * BOUND + Duration::from_millis(500)).await;
    assert!(!flag.is_healthy(), "silent twice");
    let w = watches(&queries);
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(w.iter().all(|q| q.contains("resourceVersion=1")), "{w:?}");
    // The third is answered and ended by the server after 4 s: proved.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(flag.is_healthy());
    assert_eq!(lists(&queries), 1, "never relisted");
    let handed: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert!(
        handed.iter().all(|e| e.starts_with("error")),
        "only the dropped request's error: {handed:?}"
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
fn every_watch_is_asked_to_end_within_half_the_bound() {
    let s = Duration::from_secs;
    for (bound, preset, want) in [
        (None, None, None),
        (Some(s(90)), None, Some(45)),
        (Some(s(70)), None, Some(35)),
        (Some(s(3600)), None, Some(290)),
        (Some(s(90)), Some(30), Some(30)),
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
    let flag = crate::Readiness::new(paged()).register("test/configmaps");
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
