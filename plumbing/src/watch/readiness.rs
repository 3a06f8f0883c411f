//! Readiness and watch health, one entry per watch named `<component>/<resource>`.
//!
//! A binary is ready once every watch it needs has completed its first list, and stops being
//! ready while one of them has been unhealthy (failing, or relisting after a failure) for longer
//! than `--watch-stale-after`: past that bound its caches are too old to trust, and an operator
//! should see it. Liveness is deliberately not tied to it: restarting the process during an
//! apiserver outage would only lose the warm caches. Leadership is not part of readiness
//! either: a standby replica is healthy and ready.

use std::{
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use prometheus::{
    GaugeVec, IntCounterVec, Opts,
    core::{Collector, Desc},
    proto::MetricFamily,
};
use tokio::time::Instant;

/// `--watch-list`: how each watch lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WatchList {
    /// Stream; list in pages from the first refusal (or a stream that does not end) on.
    Auto,
    /// Stream only.
    On,
    /// List in pages.
    Off,
}

/// How watches retry and when a failing one makes the binary not ready.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WatchSettings {
    /// A watch unhealthy for longer than this makes `/readyz` answer 503.
    pub stale_after: Duration,
    /// Longest wait between two attempts to re-establish a failed watch.
    pub backoff_max: Duration,
    /// A watch that has delivered neither an event nor a bookmark for this long has failed
    /// (its connection is up but nothing comes through); zero turns the check off.
    pub silent_after: Duration,
    /// How each watch lists: streamed (`sendInitialEvents`), paged, or streamed with a fallback.
    pub list: WatchList,
    /// In `auto`, a streamed list that has not reached its end this long after it was asked
    /// for falls back to the paged list.
    pub list_timeout: Duration,
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            stale_after: Duration::from_secs(30),
            backoff_max: Duration::from_secs(2),
            silent_after: Duration::from_secs(90),
            list: WatchList::Off,
            list_timeout: Duration::from_secs(30),
        }
    }
}

/// Health of one watch, shared by the task that drives it and the admin server.
struct State {
    /// The first full list completed (readiness at start-up).
    listed: bool,
    /// An error was seen and no full list has completed since.
    failing: bool,
    /// A list is under way (between `Init` and `InitDone`): the store is not yet current.
    relisting: bool,
    /// Since when the watch is not healthy; `None` while healthy.
    unhealthy_since: Option<Instant>,
    /// When the last warning was logged, to keep an outage to a few lines per watch.
    last_warned: Option<Instant>,
}

struct Watch {
    name: String,
    state: Mutex<State>,
    /// Bumped at every change of health: what was built from the store at one epoch is
    /// current only while the epoch holds.
    epoch: AtomicU64,
    /// Mirror of `State::listed` for the hot `is_ready` path.
    listed: AtomicBool,
    errors: prometheus::IntCounter,
    list_fallbacks: prometheus::IntCounter,
}

struct Inner {
    watches: Mutex<Vec<Arc<Watch>>>,
    settings: WatchSettings,
    stale: GaugeVec,
    errors: IntCounterVec,
    list_fallbacks: IntCounterVec,
}

#[derive(Clone)]
pub struct Readiness {
    inner: Arc<Inner>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new(WatchSettings::default())
    }
}

/// One watch's handle: readiness and health; cheap to clone into the task that drives it.
#[derive(Clone)]
pub struct ReadyFlag {
    watch: Arc<Watch>,
    settings: WatchSettings,
}

/// Why the binary is not ready.
#[derive(Debug, Clone, PartialEq)]
pub enum NotReady {
    /// The watch has not completed its first list.
    NotListed(String),
    /// The watch has been failing or relisting for this long (over the bound).
    Stale(String, Duration),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::NotListed(n) => write!(f, "{n}: waiting for first list"),
            NotReady::Stale(n, d) => write!(f, "{n}: not healthy for {}s", d.as_secs()),
        }
    }
}

impl ReadyFlag {
    pub fn name(&self) -> &str {
        &self.watch.name
    }

    pub fn settings(&self) -> WatchSettings {
        self.settings
    }

    fn change(&self, f: impl FnOnce(&mut State)) {
        let mut s = self.watch.state.lock().expect("watch state lock");
        let before = (s.listed, s.failing, s.relisting);
        f(&mut s);
        // Confirming what is already known (a list applied twice) does not make what was built
        // from the store out of date.
        if before != (s.listed, s.failing, s.relisting) {
            self.watch.epoch.fetch_add(1, Ordering::AcqRel);
        }
        let healthy = s.listed && !s.failing && !s.relisting;
        match (healthy, s.unhealthy_since) {
            (true, Some(since)) => {
                if s.failing || s.last_warned.is_some() {
                    tracing::info!(watch = %self.watch.name, unhealthy_for = ?since.elapsed(), "watch recovered");
                }
                s.unhealthy_since = None;
                s.last_warned = None;
            }
            (false, None) => s.unhealthy_since = Some(Instant::now()),
            _ => {}
        }
        self.watch.listed.store(s.listed, Ordering::Release);
    }

    /// A full list has completed and been applied, or a watch re-opened after a silence has
    /// delivered an event or a bookmark: the store is current and the watch runs.
    pub fn mark_ready(&self) {
        self.change(|s| {
            s.listed = true;
            s.failing = false;
            s.relisting = false;
        });
    }

    /// A list has begun: until it completes, the store may miss what changed meanwhile.
    pub fn relist_started(&self) {
        self.change(|s| s.relisting = true);
    }

    /// The watch failed; it stays unhealthy until a full list completes (or, after a silence,
    /// until the re-opened watch is heard from: [`ReadyFlag::mark_ready`]). Logged here, one way
    /// for every watch: a warning when the failure starts and every 10 s while it lasts.
    pub fn failed(&self, error: &dyn fmt::Display, retry_in: Duration) {
        self.fail(error, retry_in, None);
    }

    /// The watch has delivered nothing (no event, no bookmark) since `last_heard`: it failed
    /// then, not now. Its cache has been stale since, which is what `/readyz` and
    /// `groundskeeper_watch_stale_seconds` report from here on.
    pub fn silent_since(&self, error: &dyn fmt::Display, last_heard: Instant) {
        self.fail(error, Duration::ZERO, Some(last_heard));
    }

    fn fail(&self, error: &dyn fmt::Display, retry_in: Duration, since: Option<Instant>) {
        self.watch.errors.inc();
        self.change(|s| {
            s.failing = true;
            if let Some(since) = since {
                s.unhealthy_since = Some(s.unhealthy_since.map_or(since, |u| u.min(since)));
            }
            let now = Instant::now();
            let failing_for = s.unhealthy_since.map_or(Duration::ZERO, |t| now - t);
            if s.last_warned.is_none_or(|t| now - t >= Duration::from_secs(10)) {
                s.last_warned = Some(now);
                tracing::warn!(watch = %self.watch.name, error = %error, failing_for = ?failing_for, retry_in = ?retry_in, "watch failed; relisting after backoff");
            } else {
                tracing::debug!(watch = %self.watch.name, error = %error, retry_in = ?retry_in, "watch failed again");
            }
        });
    }

    /// The server did not serve this watch a streamed list (`--watch-list=auto`): it lists in
    /// pages from now on. Logged and counted once per watch.
    pub fn list_fell_back(&self, reason: &dyn fmt::Display) {
        self.watch.list_fallbacks.inc();
        tracing::warn!(watch = %self.watch.name, reason = %reason, "streaming list not served; listing in pages from now on");
    }

    /// Whether the first list has completed (start-up readiness).
    pub fn is_ready(&self) -> bool {
        self.watch.listed.load(Ordering::Acquire)
    }

    /// Listed, not failing and not relisting: the store reflects the server.
    pub fn is_healthy(&self) -> bool {
        self.health().is_some()
    }

    /// The epoch while healthy, `None` otherwise. Something built from the store while healthy
    /// is still current when a later call returns the same epoch.
    pub fn health(&self) -> Option<u64> {
        let s = self.watch.state.lock().expect("watch state lock");
        (s.listed && !s.failing && !s.relisting).then(|| self.watch.epoch.load(Ordering::Acquire))
    }

    /// How long the watch has not been healthy (zero while it is).
    pub fn stale_for(&self) -> Duration {
        let s = self.watch.state.lock().expect("watch state lock");
        s.unhealthy_since.map_or(Duration::ZERO, |t| t.elapsed())
    }
}

impl Readiness {
    pub fn new(settings: WatchSettings) -> Self {
        let stale = GaugeVec::new(
            Opts::new(
                "groundskeeper_watch_stale_seconds",
                "Seconds since the watch was last known healthy (listed, not failing, not relisting); 0 while healthy",
            ),
            &["watch"],
        )
        .expect("valid metric");
        let errors = IntCounterVec::new(
            Opts::new(
                "groundskeeper_watch_errors_total",
                "Watch and list errors, each followed by a relist after backoff",
            ),
            &["watch"],
        )
        .expect("valid metric");
        let list_fallbacks = IntCounterVec::new(
            Opts::new(
                "groundskeeper_watch_list_fallbacks_total",
                "Streamed lists (--watch-list=auto) the server did not serve, after which the watch lists in pages",
            ),
            &["watch"],
        )
        .expect("valid metric");
        Self {
            inner: Arc::new(Inner {
                watches: Mutex::new(Vec::new()),
                settings,
                stale,
                errors,
                list_fallbacks,
            }),
        }
    }

    pub fn settings(&self) -> WatchSettings {
        self.inner.settings
    }

    /// Registers a watch that must list before the binary is ready, by its
    /// `<component>/<resource>` name (also the `watch` label of the watch metrics).
    pub fn register(&self, name: impl Into<String>) -> ReadyFlag {
        let name = name.into();
        let watch = Arc::new(Watch {
            errors: self.inner.errors.with_label_values(&[&name]),
            list_fallbacks: self.inner.list_fallbacks.with_label_values(&[&name]),
            name,
            state: Mutex::new(State {
                listed: false,
                failing: false,
                relisting: false,
                unhealthy_since: Some(Instant::now()),
                last_warned: None,
            }),
            epoch: AtomicU64::new(0),
            listed: AtomicBool::new(false),
        });
        self.inner
            .watches
            .lock()
            .expect("readiness lock")
            .push(watch.clone());
        ReadyFlag {
            watch,
            settings: self.inner.settings,
        }
    }

    fn flags(&self) -> Vec<ReadyFlag> {
        self.inner
            .watches
            .lock()
            .expect("readiness lock")
            .iter()
            .map(|w| ReadyFlag {
                watch: w.clone(),
                settings: self.inner.settings,
            })
            .collect()
    }

    /// Names of registered watches that have not listed yet.
    pub fn pending(&self) -> Vec<String> {
        self.flags()
            .iter()
            .filter(|f| !f.is_ready())
            .map(|f| f.name().to_string())
            .collect()
    }

    /// Why the binary is not ready; empty means ready.
    pub fn not_ready(&self) -> Vec<NotReady> {
        let bound = self.inner.settings.stale_after;
        self.flags()
            .iter()
            .filter_map(|f| {
                if !f.is_ready() {
                    return Some(NotReady::NotListed(f.name().to_string()));
                }
                let stale = f.stale_for();
                (stale > bound).then(|| NotReady::Stale(f.name().to_string(), stale))
            })
            .collect()
    }

    pub fn is_ready(&self) -> bool {
        self.not_ready().is_empty()
    }

    /// The collector of `groundskeeper_watch_stale_seconds`, `groundskeeper_watch_errors_total` and
    /// `groundskeeper_watch_list_fallbacks_total`,
    /// to register once in the binary's registry.
    pub fn collector(&self) -> Box<dyn Collector> {
        Box::new(WatchCollector(self.clone()))
    }
}

struct WatchCollector(Readiness);

impl Collector for WatchCollector {
    fn desc(&self) -> Vec<&Desc> {
        let i = &self.0.inner;
        i.stale
            .desc()
            .into_iter()
            .chain(i.errors.desc())
            .chain(i.list_fallbacks.desc())
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let i = &self.0.inner;
        // The gauge is a function of time: computed at scrape time, not pushed.
        for f in self.0.flags() {
            i.stale
                .with_label_values(&[f.name()])
                .set(f.stale_for().as_secs_f64());
        }
        i.stale
            .collect()
            .into_iter()
            .chain(i.errors.collect())
            .chain(i.list_fallbacks.collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_watch_listed() {
        let r = Readiness::default();
        assert!(r.is_ready(), "nothing registered yet is vacuously ready");
        let pods = r.register("pods");
        let nodes = r.register("nodes");
        assert_eq!(r.pending(), vec!["pods", "nodes"]);
        pods.mark_ready();
        assert!(!r.is_ready());
        assert_eq!(r.pending(), vec!["nodes"]);
        nodes.mark_ready();
        assert!(r.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_failing_past_the_bound_makes_the_binary_not_ready() {
        let r = Readiness::new(WatchSettings {
            stale_after: Duration::from_secs(30),
            ..WatchSettings::default()
        });
        let w = r.register("podgc/pods");
        w.mark_ready();
        let e0 = w.health().expect("healthy after the list");
        assert_eq!(w.stale_for(), Duration::ZERO);

        w.failed(&"connection refused", Duration::from_secs(1));
        assert_eq!(w.health(), None);
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(r.is_ready(), "a short failure does not flap readiness");
        w.relist_started();
        w.failed(&"connection refused", Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            r.not_ready(),
            vec![NotReady::Stale(
                "podgc/pods".into(),
                Duration::from_secs(31)
            )]
        );
        assert!(
            w.is_ready(),
            "first-list readiness is kept through the outage"
        );

        w.relist_started();
        assert!(!r.is_ready(), "a relist alone does not end the staleness");
        w.mark_ready();
        assert!(r.is_ready());
        let e1 = w.health().expect("healthy again");
        assert_ne!(e0, e1, "what was built before the outage is not current");
        w.mark_ready();
        assert_eq!(
            w.health(),
            Some(e1),
            "a list confirmed twice changes nothing"
        );
        assert_eq!(w.stale_for(), Duration::ZERO);
    }

    /// A watch found silent at 90 s has been stale since it was last heard from: the binary is
    /// not ready at once (30 s bound), and the metrics say 90 s, not 0.
    #[tokio::test(start_paused = true)]
    async fn a_silent_watch_is_stale_since_it_was_last_heard_from() {
        let r = Readiness::default();
        let registry = prometheus::Registry::new();
        registry.register(r.collector()).unwrap();
        let w = r.register("podgc/nodes");
        w.mark_ready();
        let healthy = w.health().expect("listed");
        let last_heard = Instant::now();
        tokio::time::advance(Duration::from_secs(90)).await;
        assert!(r.is_ready(), "nobody knows yet");
        w.silent_since(&"no event or bookmark for 90s", last_heard);
        assert_eq!(w.health(), None, "the passes built on it stop");
        assert_ne!(Some(healthy), w.health());
        assert_eq!(
            r.not_ready(),
            vec![NotReady::Stale(
                "podgc/nodes".into(),
                Duration::from_secs(90)
            )]
        );
        let text = crate::metrics::render(&registry);
        for want in [
            "groundskeeper_watch_errors_total{watch=\"podgc/nodes\"} 1",
            "groundskeeper_watch_stale_seconds{watch=\"podgc/nodes\"} 90",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        w.mark_ready();
        assert!(r.is_ready(), "a relist ends it");
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_say_how_stale_each_watch_is_and_count_errors() {
        let r = Readiness::default();
        let registry = prometheus::Registry::new();
        registry.register(r.collector()).unwrap();
        let a = r.register("conntrack/services");
        let b = r.register("conntrack/endpointslices");
        a.mark_ready();
        b.mark_ready();
        b.failed(&"gone", Duration::from_secs(1));
        b.failed(&"gone", Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(7)).await;
        let text = crate::metrics::render(&registry);
        for want in [
            "groundskeeper_watch_stale_seconds{watch=\"conntrack/services\"} 0",
            "groundskeeper_watch_stale_seconds{watch=\"conntrack/endpointslices\"} 7",
            "groundskeeper_watch_errors_total{watch=\"conntrack/endpointslices\"} 2",
            "groundskeeper_watch_errors_total{watch=\"conntrack/services\"} 0",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
