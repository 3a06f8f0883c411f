//! The watch under every cache (`super::cache::follow`): kube-runtime's `watcher`, with a short
//! capped backoff, a full relist after every error, and the watch's health kept in its
//! [`ReadyFlag`].
//!
//! Why not `default_backoff()`: it grows to 30 s (and only resets after 120 s without
//! errors), so after a 30 s apiserver outage a watch can wait another half minute before
//! its next attempt, its component blind meanwhile. Here a failed watch is retried
//! after at most `--watch-backoff-max` (2 s by default), jittered down to half of it so that
//! the agents of a large cluster do not come back in step.
//!
//! Why relist after every error, where `watcher` would resume from the last resourceVersion:
//! a resumed watch that stays quiet never proves it is current (kube-runtime emits nothing when
//! a watch restarts), so the store could not be trusted again before the next event. A relist
//! ends with `InitDone`, which does prove it. client-go's reflector also lists again after
//! most watch errors; with the apiserver's watch cache a list is cheap, and after an apiserver
//! restart the old resourceVersion is usually gone anyway (410).
//!
//! Why a watch that is merely quiet can fail: a connection can stay up while nothing comes
//! through it (a stuck proxy or load balancer, a half-open TCP connection), and kube-runtime
//! notices only after its idle timeout, then resumes without a word. So a watch that has
//! heard nothing from the server (no event, no bookmark, no answer to a request) for
//! `--watch-silent-after` is failed: counted, and its cache stale since it was last heard from.
//! kube-runtime keeps bookmarks and requests to itself, so what the server sends is seen on the
//! way in (`Heard`).
//!
//! Why every watch is asked to end within half the bound: a watch that is alive but has nothing
//! to say must be heard from anyway. Bookmarks cannot be relied on for that: the apiserver sends
//! one only when its cache of the kind has moved past the watch's resourceVersion, and on a kind
//! nobody writes, against an etcd that cannot be asked for progress (3.4.23 here:
//! "RequestWatchProgress is disabled"), it never does (a node watch from the list's version
//! gets no bookmark, not even before its timeout). So the server ends each watch after half the
//! bound, kube-runtime watches again from the last resourceVersion (no list), and the answer to
//! that request is heard. Otherwise the quiet node, namespace and pod watches of a large cluster
//! would go "silent" once per bound, each time stopping deletions until re-watched.
//!
//! Why a silent watch is re-watched, not relisted: silence says nothing about what the store
//! holds, only that nothing came. So the silent stream is ended from our side and kube-runtime
//! watches again from the last resourceVersion it saw (an event's or a bookmark's), as after a
//! server-side timeout: the apiserver replays what was missed, or answers 410 Gone, which like
//! every other error leads to a full relist. The watch stays failed (nothing destructive may
//! act on its cache) until a watch opened after the silence proves itself: an event, a
//! bookmark, or an end by the server (a clean end of a watch means it delivered everything up
//! to it, and a 410 is never followed by one: kube-runtime stops at the error); only once every
//! event before that proof has been applied. A request of ours still unanswered at the silence
//! (a re-watch hanging on a dead connection) is dropped at the cut and made again, from the same
//! version, after the usual backoff.

use std::{
    fmt::Debug,
    hash::{BuildHasher, RandomState},
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::{
    Api, Resource,
    runtime::watcher::{self, Event, watcher},
};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::ReadyFlag;

/// First retry delay; doubled per consecutive failure up to the cap.
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(200);

/// Exponential backoff from `BACKOFF_MIN` to `max`, each delay drawn in [d/2, d].
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
    /// When the server last sent this watch anything.
    heard: Heard,
    /// `--watch-silent-after`; `None` when off.
    silent_after: Option<Duration>,
    inner: Option<BoxStream<'static, watcher::Result<Event<K>>>>,
    backoff: Backoff,
    /// `InitDone`, or the first event of a re-watch after a silence, was handed out: the watch
    /// becomes healthy when the consumer asks for the next event, i.e. once it has applied it.
    caught_up: bool,
    /// The watch went silent, was cut and is resuming from its last resourceVersion: failed
    /// until a watch opened since proves itself (an event, a bookmark or a clean end).
    resuming: bool,
    /// A new list was asked for and the server has not answered yet.
    awaiting_answer: bool,
    /// How long that first answer may take before the request is dropped and made again.
    list_deadline: Duration,
    /// Streamed or paged lists, and the fallback from one to the other (`--watch-list`).
    list: super::list::Lister,
}

/// How long a list may go unanswered before it is dropped and asked again. A kube-apiserver
/// that is still starting holds requests that arrive early for seconds after it turns ready,
/// longer than a request made after ready takes (docs/benchmarks.md, the fault tests); a
/// connection that went dead silently would hold one for the 295 s read timeout.
/// Doubled after each such timeout up to [`LIST_DEADLINE_MAX`], so a list that legitimately
/// takes long still gets through.
pub(crate) const LIST_DEADLINE: Duration = Duration::from_secs(3);
const LIST_DEADLINE_MAX: Duration = Duration::from_secs(60);

/// Bookmarks asked for, and the watch asked to end after half of `silent_after` (at most the
/// 290 s kube-runtime uses), so that a quiet watch is heard from, by the answer to its next
/// request, within the bound even when no bookmark comes (see the module doc).
pub(crate) fn with_bookmarks(
    mut config: watcher::Config,
    silent_after: Option<Duration>,
) -> watcher::Config {
    config.bookmarks = true;
    if let Some(bound) = silent_after {
        let half = u32::try_from(bound.as_secs() / 2)
            .unwrap_or(u32::MAX)
            .clamp(3, 290);
        config.timeout = Some(config.timeout.map_or(half, |t| t.min(half)));
    }
    config
}

/// Watches every `K` for ever (cluster-wide): the events of kube-runtime's `watcher`, never an
/// error (errors are logged, counted and retried here, and turn the flag unhealthy until the
/// next full list). Components do not call this: they watch through [`super::cache::follow`],
/// which keeps a store.
pub(crate) fn watch<K>(
    client: kube::Client,
    scope: impl FnOnce(kube::Client) -> Api<K>,
    config: watcher::Config,
    flag: ReadyFlag,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let settings = flag.settings();
    let backoff = Backoff::new(settings.backoff_max);
    let silent_after = Some(settings.silent_after).filter(|d| !d.is_zero());
    let heard = Heard::default();
    let api = scope(super::list::consistent(heard.client(client), &config));
    let driver = Driver {
        api,
        config: with_bookmarks(config, silent_after),
        flag,
        heard,
        silent_after,
        inner: None,
        backoff,
        caught_up: false,
        resuming: false,
        awaiting_answer: false,
        list_deadline: LIST_DEADLINE,
        list: super::list::Lister::new(settings.list, settings.list_timeout),
    };
    futures::stream::unfold(driver, |mut d| async move {
        if std::mem::take(&mut d.caught_up) {
            d.flag.mark_ready();
        }
        loop {
            if d.inner.is_none() {
                d.awaiting_answer = true;
                d.heard.now();
            }
            let inner = d.inner.get_or_insert_with(|| {
                d.list
                    .start(watcher(d.api.clone(), d.list.config(&d.config)).boxed())
            });
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
            } else if let Some(bound) = d.silent_after {
                let mut next = inner.next();
                let silent = loop {
                    let last = d.heard.last();
                    tokio::select! {
                        biased;
                        n = &mut next => break Ok(n),
                        // Only once `next` is pending: every event the stream delivered
                        // before the proof has been handed out and applied.
                        _ = d.heard.proved() => {
                            if d.resuming && d.heard.proved_since_cut() {
                                d.resuming = false;
                                d.flag.mark_ready();
                            }
                        }
                        _ = tokio::time::sleep_until(last + bound) => {
                            // A bookmark kube-runtime kept to itself may have come meanwhile.
                            if d.heard.last() == last {
                                break Err(last);
                            }
                        }
                    }
                };
                match silent {
                    Ok(n) => n,
                    Err(last) => {
                        // A request still unanswered hangs on a dead connection: the cut
                        // drops it, and kube-runtime asks again from the same version.
                        let unanswered = if d.heard.in_flight() {
                            ", a request unanswered (dropped)"
                        } else {
                            ""
                        };
                        d.heard.cut();
                        d.resuming = true;
                        d.flag.silent_since(
                            &format_args!(
                                "nothing from the server for {:?} (--watch-silent-after {bound:?}){unanswered}; re-watching from the last resourceVersion",
                                last.elapsed()
                            ),
                            last,
                        );
                        continue;
                    }
                }
            } else {
                inner.next().await
            };
            match next {
                Some(Ok(ev)) => {
                    d.list.seen(&ev);
                    match &ev {
                        // Emitted before the list request: no proof the server answers.
                        Event::Init => d.flag.relist_started(),
                        _ => {
                            d.awaiting_answer = false;
                            d.list_deadline = LIST_DEADLINE;
                            // A re-watch's first event proves it as a bookmark would.
                            let resumed =
                                d.resuming && matches!(ev, Event::Apply(_) | Event::Delete(_));
                            if resumed {
                                d.resuming = false;
                            }
                            d.caught_up |= resumed || matches!(ev, Event::InitDone);
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
                Some(Err(e)) if d.list.fell_back(&e, &d.flag) => {
                    // Listed again at once, in pages: the server answered, it is not down.
                    d.inner = None;
                    d.resuming = false;
                }
                Some(Err(e)) => {
                    // After a silence, a watch that could not be opened (its request dropped
                    // at the cut, or refused) is asked again from the same version by
                    // kube-runtime; anything else (410 Gone included) is relisted.
                    if !(d.resuming && matches!(e, watcher::Error::WatchStartFailed(_))) {
                        d.inner = None;
                        d.resuming = false;
                    }
                    let delay = d.backoff.next_delay();
                    d.flag.failed(&Explained(&e), delay);
                    tokio::time::sleep(delay).await;
                }
                // `watcher` does not end; if it did, start over like after an error.
                None => {
                    d.inner = None;
                    d.resuming = false;
                }
            }
        }
    })
}

/// When the server last sent one watch anything: response headers or a body frame (an event,
/// a bookmark, a list page). Shared by the watch's client, which records it, and its driver,
/// which can also end ("cut") every response body received so far.
#[derive(Clone)]
struct Heard(Arc<HeardState>);

struct HeardState {
    last: Mutex<Instant>,
    /// Bumped by each cut: a body from an older generation ends at its next poll.
    generation: AtomicU64,
    /// 1 + the generation of the last watch that proved itself (a bookmark came through it,
    /// or the server ended it); 0 before any.
    proved: AtomicU64,
    proof: tokio::sync::Notify,
    /// Requests sent and not answered yet.
    in_flight: AtomicUsize,
    /// Wakes the requests in flight at a cut, which drops them.
    cuts: tokio::sync::Notify,
}

impl Default for Heard {
    fn default() -> Self {
        Self(Arc::new(HeardState {
            last: Mutex::new(Instant::now()),
            generation: AtomicU64::new(0),
            proved: AtomicU64::new(0),
            proof: tokio::sync::Notify::new(),
            in_flight: AtomicUsize::new(0),
            cuts: tokio::sync::Notify::new(),
        }))
    }
}

/// How the apiserver starts a bookmark line of a JSON watch stream.
const BOOKMARK_LINE: &[u8] = br#"{"type":"BOOKMARK""#;

/// Counts a request in flight until it is answered or dropped.
struct InFlight(Heard);

impl InFlight {
    fn new(heard: &Heard) -> Self {
        heard.0.in_flight.fetch_add(1, Ordering::AcqRel);
        Self(heard.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Heard {
    fn now(&self) {
        *self.0.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn last(&self) -> Instant {
        *self.0.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn in_flight(&self) -> bool {
        self.0.in_flight.load(Ordering::Acquire) > 0
    }

    /// Ends every body received so far (kube-runtime then sees its watch end, as at a
    /// server-side timeout, and watches again from its last resourceVersion). The silence
    /// bound counts from here.
    fn cut(&self) {
        self.0.generation.fetch_add(1, Ordering::AcqRel);
        self.0.cuts.notify_waiters();
        self.now();
    }

    /// Returns once a cut came after `generation`.
    async fn cut_after(&self, generation: u64) {
        loop {
            let cut = self.0.cuts.notified();
            let mut cut = std::pin::pin!(cut);
            cut.as_mut().enable();
            if self.0.generation.load(Ordering::Acquire) > generation {
                return;
            }
            cut.await;
        }
    }

    /// A watch requested since the last cut proved itself.
    fn proved_since_cut(&self) -> bool {
        self.0.proved.load(Ordering::Acquire) > self.0.generation.load(Ordering::Acquire)
    }

    /// Wakes after a watch proved itself (or at once, for a proof not yet waited for).
    async fn proved(&self) {
        self.0.proof.notified().await
    }

    fn prove(&self, generation: u64) {
        self.0.proved.fetch_max(generation + 1, Ordering::AcqRel);
        self.0.proof.notify_one();
    }

    /// `client`, recording here whatever its responses bring in.
    fn client(&self, client: kube::Client) -> kube::Client {
        let ns = client.default_namespace().to_string();
        let heard = self.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (client, heard) = (client.clone(), heard.clone());
            let watch = req.uri().query().is_some_and(|q| q.contains("watch=true"));
            async move {
                let generation = heard.0.generation.load(Ordering::Acquire);
                let in_flight = InFlight::new(&heard);
                let res = tokio::select! {
                    res = client.send(req) => res,
                    _ = heard.cut_after(generation) => Err(kube::Error::Service(
                        "dropped unanswered: the watch went silent".into(),
                    )),
                };
                drop(in_flight);
                let res = res?;
                heard.now();
                let watch = watch && res.status().is_success();
                Ok::<_, kube::Error>(res.map(|body| HeardBody {
                    body,
                    heard,
                    generation,
                    bookmarks: watch.then(Vec::new),
                }))
            }
        });
        kube::Client::new(service, ns)
    }
}

/// A response body that records in [`Heard`] each frame it yields, and ends once cut.
struct HeardBody {
    body: kube::client::Body,
    heard: Heard,
    /// [`Heard`]'s generation when the request was sent.
    generation: u64,
    /// For a watch: the tail of the last frame, where a bookmark line may have begun.
    bookmarks: Option<Vec<u8>>,
}

impl HeardBody {
    fn cut(&self) -> bool {
        self.heard.0.generation.load(Ordering::Acquire) > self.generation
    }

    fn look_for_bookmark(&mut self, data: &[u8]) {
        let Some(tail) = self.bookmarks.as_mut() else {
            return;
        };
        let n = BOOKMARK_LINE.len();
        let is_bookmark = |w: &[u8]| w == BOOKMARK_LINE;
        // A line that began in the last frame: its tail and this frame's head.
        let mut across = std::mem::take(tail);
        across.extend_from_slice(&data[..data.len().min(n - 1)]);
        let seen = across.windows(n).any(is_bookmark) || data.windows(n).any(is_bookmark);
        let from = across.len().saturating_sub(n - 1);
        tail.extend_from_slice(&across[from..]);
        if data.len() >= n - 1 {
            tail.clear();
            tail.extend_from_slice(&data[data.len() - (n - 1)..]);
        }
        if seen {
            self.heard.prove(self.generation);
        }
    }
}

impl http_body::Body for HeardBody {
    type Data = bytes::Bytes;
    type Error = kube::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.cut() {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                self.heard.now();
                if let Some(data) = frame.data_ref() {
                    let data = data.clone();
                    self.look_for_bookmark(&data);
                }
            }
            // The server ended the watch: everything before was delivered.
            Poll::Ready(None) if self.bookmarks.is_some() => {
                self.heard.now();
                self.heard.prove(self.generation);
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.cut() || self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A watch error with a hint for the one cause an operator fixes by hand.
pub(crate) struct Explained<'a>(pub(crate) &'a watcher::Error);

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
