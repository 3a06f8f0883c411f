//! The watch under every cache (`crate::cache::follow`): kube-runtime's `watcher`, with a short
//! capped backoff, a full relist after every error, and the watch's health kept in its
//! [`ReadyFlag`].
//!
//! Why not `default_backoff()`: it grows to 30 s (and only resets after 120 s without
//! errors), so after a 30 s apiserver outage a watch could wait another half minute before
//! its next attempt: the agents were blind for about 50 s. Here a failed watch is retried
//! after at most `--watch-backoff-max` (2 s by default), jittered down to half of it so that
//! the agents of a large cluster do not come back in step.
//!
//! Why relist after every error, where `watcher` would resume from the last resourceVersion:
//! a resumed watch that stays quiet never proves it is current (kube-runtime emits nothing when
//! a watch restarts), so the store could not be trusted again before the next event. A relist
//! ends with `InitDone`, which does prove it. client-go's reflector also lists again after
//! most watch errors; with the apiserver's watch cache a list is cheap, and after an apiserver
//! restart the old resourceVersion is usually gone anyway (410).

use std::{
    fmt::Debug,
    hash::{BuildHasher, RandomState},
    time::Duration,
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::{
    Api, Resource,
    runtime::watcher::{self, Event, watcher},
};
use serde::de::DeserializeOwned;

use crate::ReadyFlag;

/// First retry delay; doubled per consecutive failure up to the cap.
const BACKOFF_MIN: Duration = Duration::from_millis(200);

/// Exponential backoff from [`BACKOFF_MIN`] to `max`, each delay drawn in [d/2, d].
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(max: Duration) -> Self {
        Self {
            next: BACKOFF_MIN.min(max),
            max,
        }
    }

    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        // std's RandomState is seeded per instance: enough randomness for jitter.
        let r = RandomState::new().hash_one(0u8) as f64 / u64::MAX as f64;
        d.mul_f64(0.5 + 0.5 * r)
    }

    /// After data from the server: the next failure starts from the shortest delay again.
    pub fn reset(&mut self) {
        self.next = BACKOFF_MIN.min(self.max);
    }
}

struct Driver<K: Resource + Clone + 'static> {
    api: Api<K>,
    config: watcher::Config,
    flag: ReadyFlag,
    inner: Option<BoxStream<'static, watcher::Result<Event<K>>>>,
    backoff: Backoff,
    /// `InitDone` was handed out: the watch becomes healthy when the consumer asks for the
    /// next event, i.e. once it has applied the list to its store.
    listed: bool,
    /// A new list was asked for and the server has not answered yet.
    awaiting_answer: bool,
    /// How long that first answer may take before the request is dropped and made again.
    list_deadline: Duration,
}

/// How long a list may go unanswered before it is dropped and asked again. A kube-apiserver
/// that is still starting holds requests that arrive early for seconds after it turns ready
/// (measured: 4-7 s after an etcd restart, where a request made after ready is answered in
/// 1 s); a connection that went dead silently would hold one for the 295 s read timeout.
/// Doubled after each such timeout up to [`LIST_DEADLINE_MAX`], so a list that legitimately
/// takes long still gets through.
const LIST_DEADLINE: Duration = Duration::from_secs(3);
const LIST_DEADLINE_MAX: Duration = Duration::from_secs(60);

/// Watches `api` for ever: the events of kube-runtime's `watcher`, never an error (errors are
/// logged, counted and retried here, and turn the flag unhealthy until the next full list).
/// Components do not call this: they watch through [`crate::cache::follow`], which keeps a store.
pub(crate) fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    flag: ReadyFlag,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let backoff = Backoff::new(flag.settings().backoff_max);
    let driver = Driver {
        api,
        config,
        flag,
        inner: None,
        backoff,
        listed: false,
        awaiting_answer: false,
        list_deadline: LIST_DEADLINE,
    };
    futures::stream::unfold(driver, |mut d| async move {
        if std::mem::take(&mut d.listed) {
            d.flag.mark_ready();
        }
        loop {
            if d.inner.is_none() {
                d.awaiting_answer = true;
            }
            let inner = d
                .inner
                .get_or_insert_with(|| watcher(d.api.clone(), d.config.clone()).boxed());
            let next = if d.awaiting_answer {
                match tokio::time::timeout(d.list_deadline, inner.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        // Asked again at once: the deadline itself spaced the attempts, and
                        // doubles, so a server that holds every request is not hammered.
                        d.inner = None;
                        let waited = d.list_deadline;
                        d.list_deadline = (d.list_deadline * 2).min(LIST_DEADLINE_MAX);
                        d.flag.failed(
                            &format_args!("no answer to the list within {waited:?}; asking again"),
                            Duration::ZERO,
                        );
                        continue;
                    }
                }
            } else {
                inner.next().await
            };
            match next {
                Some(Ok(ev)) => {
                    match &ev {
                        // Emitted before the list request: no proof the server answers.
                        Event::Init => d.flag.relist_started(),
                        _ => {
                            d.awaiting_answer = false;
                            d.list_deadline = LIST_DEADLINE;
                            d.listed |= matches!(ev, Event::InitDone);
                            // Only an event from the watch itself proves the watch works: were a
                            // good list enough, a watch refused right after it (RBAC granting
                            // list but not watch, a proxy cutting streams) would relist every
                            // 200 ms for ever, on every node.
                            if matches!(ev, Event::Apply(_) | Event::Delete(_)) {
                                d.backoff.reset();
                            }
                        }
                    }
                    return Some((Ok(ev), d));
                }
                Some(Err(e)) => {
                    d.inner = None;
                    let delay = d.backoff.next_delay();
                    d.flag.failed(&Explained(&e), delay);
                    tokio::time::sleep(delay).await;
                }
                // `watcher` does not end; if it did, start over like after an error.
                None => d.inner = None,
            }
        }
    })
}

/// A watch error with a hint for the one cause an operator fixes by hand.
struct Explained<'a>(&'a watcher::Error);

impl std::fmt::Display for Explained<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        if let watcher::Error::InitialListFailed(kube::Error::Api(s)) = self.0
            && s.code == 404
        {
            write!(f, " (the resource is not served: is its CRD installed?)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let api: Api<ConfigMap> = Api::namespaced(fake_apiserver(lists.clone()), "default");
        let mut stream = std::pin::pin!(watch(api, watcher::Config::default(), flag.clone()));
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
        let api: Api<ConfigMap> = Api::namespaced(fake_apiserver(lists.clone()), "default");
        let stream = watch(api, watcher::Config::default(), flag);
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
        let api: Api<ConfigMap> = Api::namespaced(kube::Client::new(service, "default"), "default");
        let mut stream = std::pin::pin!(watch(api, watcher::Config::default(), flag.clone()));
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
}
