//! Streamed lists (WatchList, KEP-3157): the initial state of a watch asked for with
//! `sendInitialEvents=true` as ADDED events on the watch itself, ended by a bookmark annotated
//! `k8s.io/initial-events-end`, then live events. One request instead of one per page, and no
//! page held whole, on the client or in the apiserver.
//!
//! kube-runtime streams when asked (`InitialListStrategy::StreamingList`) and yields the same
//! `Init`, `InitApply`…, `InitDone` as for a paged list, so the cache folds both alike (buffered
//! and swapped at `InitDone`). It does not fall back when the server cannot stream: that is
//! decided here, per watch, with `--watch-list`:
//! - `auto` asks for a stream; a server that refuses one ([`not_offered`]: the
//!   WatchList feature off answers 422, an etcd that cannot be asked for progress makes the
//!   apiserver end the stream with a 500 "RequestWatchProgress is disabled"), or a stream that
//!   has not reached its initial-events-end within `--watch-list-timeout`, makes that watch
//!   list in pages for the rest of the process (logged and counted once per watch:
//!   `groundskeeper_watch_list_fallbacks_total`);
//! - `on` only streams: such errors are watch errors, retried and relisted like any other;
//! - `off` (the default) lists in pages, as kube-runtime does by default.
//!
//! kube-runtime asks for the stream at `resourceVersion=0` (any state of the watch cache). A
//! watch whose config asks for consistent lists (`ListSemantic::MostRecent`, PodGC's) gets its
//! stream without it (`consistent`), as client-go's reflector asks: the apiserver then sends
//! the state as of the request, not an older one.

use std::{fmt, time::Duration};

use futures::{StreamExt, stream::BoxStream};
use kube::runtime::watcher::{self, Event, InitialListStrategy, ListSemantic};
use tokio::time::Instant;

use super::readiness::ReadyFlag;
pub use super::readiness::WatchList;

/// A streamed list that did not reach its initial-events-end in time.
#[derive(Debug)]
pub struct NoInitialEnd(pub Duration);

impl fmt::Display for NoInitialEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the streamed list did not reach its initial-events-end within {:?} (--watch-list-timeout)",
            self.0
        )
    }
}

impl std::error::Error for NoInitialEnd {}

/// Whether `e`, met before a streamed list ended, says the server does not serve streamed lists
/// (so a paged list is the way), rather than a failure a paged list would meet too (an outage,
/// 410 Gone, throttling, RBAC).
pub fn not_offered(e: &watcher::Error) -> bool {
    let status = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s,
        watcher::Error::WatchError(s) => s,
        watcher::Error::WatchFailed(kube::Error::Service(b)) => return b.is::<NoInitialEnd>(),
        _ => return false,
    };
    let names_it = ["sendInitialEvents", "WatchList", "RequestWatchProgress"]
        .iter()
        .any(|w| status.message.contains(w));
    match status.code {
        // The parameters refused: the feature gate off (422), a server or proxy that does not
        // take them.
        400 | 405 | 422 | 501 => true,
        // Refusals that name the feature: an etcd that cannot be asked for progress (500), a
        // policy against it (403).
        403 | 500 => names_it,
        _ => false,
    }
}

/// How one watch lists, and its fallback.
pub(crate) struct Lister {
    mode: WatchList,
    timeout: Duration,
    /// Lists in pages (`off`, or `auto` after a fallback).
    paged: bool,
    /// A streamed list was asked for and has not ended yet.
    streaming: bool,
}

impl Lister {
    pub(crate) fn new(mode: WatchList, timeout: Duration) -> Self {
        Self {
            mode,
            timeout,
            paged: mode == WatchList::Off,
            streaming: false,
        }
    }

    /// `base` with the list strategy of the moment.
    pub(crate) fn config(&self, base: &watcher::Config) -> watcher::Config {
        let mut c = base.clone();
        c.initial_list_strategy = if self.paged {
            InitialListStrategy::ListWatch
        } else {
            InitialListStrategy::StreamingList
        };
        c
    }

    /// A new watcher's stream; in `auto`, a streamed list is bounded by the timeout.
    pub(crate) fn start<K: Send + 'static>(
        &mut self,
        stream: BoxStream<'static, watcher::Result<Event<K>>>,
    ) -> BoxStream<'static, watcher::Result<Event<K>>> {
        self.streaming = !self.paged;
        if self.streaming && self.mode == WatchList::Auto {
            bounded(stream, self.timeout)
        } else {
            stream
        }
    }

    pub(crate) fn seen<K>(&mut self, ev: &Event<K>) {
        if matches!(ev, Event::InitDone) {
            self.streaming = false;
        }
    }

    /// After an error of the watch: whether it fell back to the paged list just now (then the
    /// watch lists again at once, in pages).
    pub(crate) fn fell_back(&mut self, e: &watcher::Error, flag: &ReadyFlag) -> bool {
        if self.mode != WatchList::Auto || !self.streaming || !not_offered(e) {
            return false;
        }
        self.paged = true;
        self.streaming = false;
        flag.list_fell_back(e);
        true
    }
}

/// `stream`, yielding a [`NoInitialEnd`] error once `bound` has passed without `InitDone`.
fn bounded<K: Send + 'static>(
    stream: BoxStream<'static, watcher::Result<Event<K>>>,
    bound: Duration,
) -> BoxStream<'static, watcher::Result<Event<K>>> {
    let deadline = Some(Instant::now() + bound);
    futures::stream::unfold((stream, deadline), move |(mut s, deadline)| async move {
        let Some(at) = deadline else {
            return s.next().await.map(|ev| (ev, (s, None)));
        };
        match tokio::time::timeout_at(at, s.next()).await {
            Ok(Some(ev)) => {
                let done = matches!(ev, Ok(Event::InitDone));
                Some((ev, (s, (!done).then_some(at))))
            }
            Ok(None) => None,
            Err(_) => {
                let e = kube::Error::Service(Box::new(NoInitialEnd(bound)));
                Some((Err(watcher::Error::WatchFailed(e)), (s, None)))
            }
        }
    })
    .boxed()
}

/// `client`, asking for a streamed list without `resourceVersion=0` (the state as of the
/// request, not any older one the watch cache holds) when `config` asks for consistent lists;
/// `client` as it is otherwise.
pub(crate) fn consistent(client: kube::Client, config: &watcher::Config) -> kube::Client {
    if config.list_semantic != ListSemantic::MostRecent {
        return client;
    }
    let ns = client.default_namespace().to_string();
    let service = tower::service_fn(move |mut req: http::Request<kube::client::Body>| {
        if let Some(uri) = without_any_version(req.uri()) {
            *req.uri_mut() = uri;
        }
        let client = client.clone();
        async move { client.send(req).await }
    });
    kube::Client::new(service, ns)
}

/// A streamed list's URI without `resourceVersion=0`; `None` for any other request.
fn without_any_version(uri: &http::Uri) -> Option<http::Uri> {
    let query = uri.query()?;
    let pairs: Vec<&str> = query.split('&').collect();
    if !pairs.contains(&"sendInitialEvents=true") || !pairs.contains(&"resourceVersion=0") {
        return None;
    }
    let kept: Vec<&str> = pairs
        .into_iter()
        .filter(|p| *p != "resourceVersion=0")
        .collect();
    format!("{}?{}", uri.path(), kept.join("&")).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn status(code: u16, message: &str) -> Box<Status> {
        Box::new(Status::failure(message, "").with_code(code))
    }

    #[test]
    fn which_errors_mean_not_offered() {
        let start =
            |code, msg| watcher::Error::WatchStartFailed(kube::Error::Api(status(code, msg)));
        let event = |code, msg| watcher::Error::WatchError(status(code, msg));
        // What a v1.36 apiserver answers with the WatchList feature gate off.
        assert!(not_offered(&start(
            422,
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
        )));
        // ... and on an etcd that cannot be asked for progress (an ERROR event on the stream).
        assert!(not_offered(&event(
            500,
            "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled"
        )));
        assert!(not_offered(&start(400, "unknown parameter")));
        assert!(not_offered(&start(501, "")));
        assert!(not_offered(&start(403, "sendInitialEvents is forbidden")));
        let timeout = kube::Error::Service(Box::new(NoInitialEnd(Duration::from_secs(30))));
        assert!(not_offered(&watcher::Error::WatchFailed(timeout)));

        // What a paged list would meet as well.
        assert!(!not_offered(&start(
            403,
            "pods is forbidden: User cannot watch"
        )));
        assert!(!not_offered(&start(500, "etcdserver: leader changed")));
        assert!(!not_offered(&event(410, "too old resource version")));
        assert!(!not_offered(&start(429, "too many requests")));
        assert!(!not_offered(&start(503, "")));
        assert!(!not_offered(&watcher::Error::WatchFailed(
            kube::Error::Service("connection reset".into())
        )));
        assert!(!not_offered(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(422, "sendInitialEvents"))
        )));
        assert!(!not_offered(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn falls_back_once_in_auto_only_while_streaming() {
        let flag = crate::Readiness::default().register("test/pods");
        let refused =
            || watcher::Error::WatchStartFailed(kube::Error::Api(status(422, "sendInitialEvents")));
        let base = watcher::Config::default();
        let strategy = |l: &Lister| l.config(&base).initial_list_strategy;

        let mut auto = Lister::new(WatchList::Auto, Duration::from_secs(30));
        assert_eq!(strategy(&auto), InitialListStrategy::StreamingList);
        let _ = auto.start::<()>(futures::stream::empty().boxed());
        assert!(auto.fell_back(&refused(), &flag));
        assert_eq!(strategy(&auto), InitialListStrategy::ListWatch);
        let _ = auto.start::<()>(futures::stream::empty().boxed());
        assert!(!auto.fell_back(&refused(), &flag), "once");

        // A stream that ended: later errors are the live watch's, not the list's.
        let mut done = Lister::new(WatchList::Auto, Duration::from_secs(30));
        let _ = done.start::<()>(futures::stream::empty().boxed());
        done.seen::<()>(&Event::InitDone);
        assert!(!done.fell_back(&refused(), &flag));
        assert_eq!(strategy(&done), InitialListStrategy::StreamingList);

        let mut on = Lister::new(WatchList::On, Duration::from_secs(30));
        let _ = on.start::<()>(futures::stream::empty().boxed());
        assert!(!on.fell_back(&refused(), &flag));
        assert_eq!(strategy(&on), InitialListStrategy::StreamingList);

        let off = Lister::new(WatchList::Off, Duration::from_secs(30));
        assert_eq!(strategy(&off), InitialListStrategy::ListWatch);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_without_its_end_times_out() {
        let events = futures::stream::iter([Ok(Event::<()>::Init), Ok(Event::InitApply(()))])
            .chain(futures::stream::pending());
        let mut s = bounded(events.boxed(), Duration::from_secs(30));
        assert!(matches!(s.next().await, Some(Ok(Event::Init))));
        assert!(matches!(s.next().await, Some(Ok(Event::InitApply(())))));
        let e = s.next().await.unwrap().unwrap_err();
        assert!(not_offered(&e), "{e}");

        // Once ended, live events may be as far apart as they like.
        let events = futures::stream::iter([Ok(Event::<()>::Init), Ok(Event::InitDone)])
            .chain(futures::stream::pending());
        let mut s = bounded(events.boxed(), Duration::from_secs(30));
        s.next().await;
        s.next().await;
        let quiet = tokio::time::timeout(Duration::from_secs(120), s.next()).await;
        assert!(quiet.is_err());
    }

    #[test]
    fn consistent_streams_drop_the_any_version() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        let streamed = uri(
            "/api/v1/pods?&watch=true&timeoutSeconds=45&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0",
        );
        assert_eq!(
            without_any_version(&streamed).unwrap(),
            uri(
                "/api/v1/pods?&watch=true&timeoutSeconds=45&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
            )
        );
        // A resumed watch keeps its version; a list is not touched.
        assert!(without_any_version(&uri("/api/v1/pods?&watch=true&resourceVersion=0")).is_none());
        assert!(without_any_version(&uri("/api/v1/pods?&limit=500")).is_none());
    }
}
