//! A rate-limited work queue with client-go's semantics: a key waiting in the queue is there
//! once, a key being processed is not handed to a second worker (it is queued again when the
//! first finishes), delayed adds keep the earliest due time, and retries back off per key
//! (exponential) and overall (token bucket), the larger delay winning. A named queue exports
//! client-go's `workqueue_*` metrics ([`metrics`]).

pub mod metrics;
#[cfg(test)]
mod metrics_tests;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use groundskeeper_plumbing::client::ratelimit::TokenBucket;
use tokio::{sync::Notify, time::Instant};

use self::metrics::{QueueMetricFamilies, QueueMetrics};

/// `DefaultTypedControllerRateLimiter`'s shape: per key `base·2^n` capped at `max`, and a
/// shared bucket of `qps`/`burst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    pub base: Duration,
    pub max: Duration,
    pub qps: f32,
    pub burst: u32,
}

impl Default for RateLimit {
    /// client-go's defaults: 5 ms doubling up to 1000 s, 10 qps with a burst of 100.
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
            qps: 10.0,
            burst: 100,
        }
    }
}

impl RateLimit {
    /// The per-key delay after `failures` earlier failures.
    pub fn backoff(&self, failures: u32) -> Duration {
        let factor = 2f64.powi(failures.min(1023) as i32);
        let secs = self.base.as_secs_f64() * factor;
        if secs >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::from_secs_f64(secs)
        }
    }
}

struct State<K> {
    queue: VecDeque<K>,
    dirty: HashSet<K>,
    processing: HashSet<K>,
    failures: HashMap<K, u32>,
    /// Keys added with a delay, by the time they are due.
    waiting: HashMap<K, Instant>,
    bucket: TokenBucket,
    shut_down: bool,
    metrics: Option<QueueMetrics<K>>,
}

struct Inner<K> {
    state: Mutex<State<K>>,
    ready: Notify,
    limit: RateLimit,
}

pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub fn new(limit: RateLimit) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    dirty: HashSet::new(),
                    processing: HashSet::new(),
                    failures: HashMap::new(),
                    waiting: HashMap::new(),
                    bucket: TokenBucket::new(limit.qps, limit.burst),
                    shut_down: false,
                    metrics: None,
                }),
                ready: Notify::new(),
                limit,
            }),
        }
    }

    /// A queue exporting client-go's `workqueue_*` series under `name` (upstream's name for the
    /// same controller's queue, so that its dashboards apply). Needs a tokio runtime: the
    /// in-progress gauges are refreshed by a task of their own.
    pub fn named(limit: RateLimit, families: &QueueMetricFamilies, name: &str) -> Self {
        let queue = Self::new(limit);
        queue.lock().metrics = Some(QueueMetrics::new(families, name));
        metrics::spawn_updater(&queue.inner, |inner: &Inner<K>| {
            let s = inner.state.lock().expect("work queue lock");
            if let Some(m) = &s.metrics {
                m.update_unfinished();
            }
            !s.shut_down
        });
        queue
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.inner.state.lock().expect("work queue lock")
    }

    pub fn add(&self, key: K) {
        let mut s = self.lock();
        self.add_locked(&mut s, key);
    }

    fn add_locked(&self, s: &mut State<K>, key: K) {
        if s.shut_down || s.dirty.contains(&key) {
            return;
        }
        if let Some(m) = &mut s.metrics {
            m.add(&key);
        }
        s.dirty.insert(key.clone());
        if s.processing.contains(&key) {
            // Queued again by `done`, so one key is never worked on twice at once.
            return;
        }
        s.queue.push_back(key);
        self.inner.ready.notify_one();
    }

    /// Adds `key` once `delay` has passed; a key already waiting keeps the earlier time.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let due = Instant::now() + delay;
        {
            let mut s = self.lock();
            if s.shut_down {
                return;
            }
            match s.waiting.get(&key) {
                Some(t) if *t <= due => return,
                _ => s.waiting.insert(key.clone(), due),
            };
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            let mut s = queue.lock();
            if s.waiting.get(&key) == Some(&due) {
                s.waiting.remove(&key);
                queue.add_locked(&mut s, key);
            }
        });
    }

    /// Requeues after the larger of the key's backoff and the shared bucket's delay.
    pub fn add_rate_limited(&self, key: K) {
        let delay = {
            let mut s = self.lock();
            let n = s.failures.get(&key).copied().unwrap_or(0);
            s.failures.insert(key.clone(), n.saturating_add(1));
            if let Some(m) = &s.metrics {
                m.retry();
            }
            let per_key = self.inner.limit.backoff(n);
            let overall = s.bucket.reserve(Instant::now());
            per_key.max(overall)
        };
        self.add_after(key, delay);
    }

    /// How many times `key` was requeued by `add_rate_limited` since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Clears the key's backoff (after a success, or when giving up on it).
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// The next key to work on, or `None` once the queue is shut down. The caller must call
    /// `done` with it.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.inner.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if s.shut_down {
                    return None;
                }
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    if let Some(m) = &mut s.metrics {
                        m.get(&key);
                    }
                    if !s.queue.is_empty() {
                        // Pass the wake-up on: other workers may be idle.
                        self.inner.ready.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if let Some(m) = &mut s.metrics {
            m.done(key);
        }
        if s.dirty.contains(key) && !s.shut_down {
            s.queue.push_back(key.clone());
            self.inner.ready.notify_one();
        }
    }

    /// Stops handing out keys: `get` returns `None` from now on; in-flight work finishes.
    pub fn shut_down(&self) {
        self.lock().shut_down = true;
        self.inner.ready.notify_waiters();
    }

    /// Keys waiting to be handed out (not counting delayed ones).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> WorkQueue<String> {
        WorkQueue::new(RateLimit::default())
    }

    async fn next(q: &WorkQueue<String>) -> String {
        q.get().await.expect("queue open")
    }

    #[test]
    fn backoff_sequence_matches_client_go() {
        let r = RateLimit::default();
        let want_ms = [
            5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240, 20480, 40960, 81920,
        ];
        for (n, ms) in want_ms.iter().enumerate() {
            assert_eq!(r.backoff(n as u32), Duration::from_millis(*ms), "n={n}");
        }
        assert_eq!(r.backoff(18), Duration::from_secs(1000), "capped");
        assert_eq!(r.backoff(u32::MAX), Duration::from_secs(1000));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_are_deduplicated_while_waiting() {
        let q = q();
        q.add("a".into());
        q.add("b".into());
        q.add("a".into());
        assert_eq!(q.len(), 2);
        assert_eq!(next(&q).await, "a");
        assert_eq!(next(&q).await, "b");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_in_progress_is_not_handed_out_again_until_done() {
        let q = q();
        q.add("a".into());
        let a = next(&q).await;
        q.add("a".into());
        q.add("a".into());
        assert!(q.is_empty(), "re-added key waits for done");
        q.add("b".into());
        assert_eq!(next(&q).await, "b");
        q.done(&a);
        assert_eq!(q.len(), 1, "re-added once");
        assert_eq!(next(&q).await, "a");
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_keeps_the_earliest_time() {
        let q = q();
        let start = Instant::now();
        q.add_after("a".into(), Duration::from_secs(10));
        q.add_after("a".into(), Duration::from_secs(3));
        q.add_after("a".into(), Duration::from_secs(7));
        assert_eq!(next(&q).await, "a");
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        q.done(&"a".to_string());
        // The superseded timers fire later but do not add the key again.
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_requeues_back_off_and_forget_resets() {
        let q = q();
        let k = "a".to_string();
        for n in 0..4u32 {
            let start = Instant::now();
            q.add_rate_limited(k.clone());
            assert_eq!(q.num_requeues(&k), n + 1);
            assert_eq!(next(&q).await, k);
            assert_eq!(start.elapsed(), Duration::from_millis(5 << n));
            q.done(&k);
        }
        q.forget(&k);
        assert_eq!(q.num_requeues(&k), 0);
        let start = Instant::now();
        q.add_rate_limited(k.clone());
        assert_eq!(next(&q).await, k);
        assert_eq!(start.elapsed(), Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn overall_bucket_limits_many_keys() {
        let q = WorkQueue::new(RateLimit {
            qps: 10.0,
            burst: 2,
            ..RateLimit::default()
        });
        let start = Instant::now();
        for k in ["a", "b", "c"] {
            q.add_rate_limited(k.to_string());
        }
        for _ in 0..3 {
            let k = next(&q).await;
            q.done(&k);
        }
        // Two from the burst after 5 ms; the third waits one token period.
        assert_eq!(start.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_wakes_idle_workers() {
        let q = q();
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        };
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(waiter.await.unwrap(), None);
        q.add("a".into());
        assert!(q.get().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_workers_all_get_work() {
        let q = q();
        let mut workers = Vec::new();
        for _ in 0..3 {
            let q = q.clone();
            workers.push(tokio::spawn(async move { q.get().await }));
        }
        tokio::task::yield_now().await;
        for k in ["a", "b", "c"] {
            q.add(k.to_string());
        }
        let mut got = Vec::new();
        for w in workers {
            got.push(w.await.unwrap().unwrap());
        }
        got.sort();
        assert_eq!(got, vec!["a", "b", "c"]);
    }
}
