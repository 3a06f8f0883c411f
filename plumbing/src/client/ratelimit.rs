//! A client-side token bucket for API requests, as client-go's `--kube-api-qps/--kube-api-burst`:
//! a burst of `burst` requests, then `qps` per second, except that a list's next pages ride on
//! its first request's token (`is_continuation`). kube-rs has none of its own.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use http::Request;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    /// When the token of the latest reservation is due.
    last_due: Instant,
}

impl TokenBucket {
    pub fn new(qps: f32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: f64::from(qps),
            burst,
            tokens: burst,
            last: Instant::now(),
            last_due: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
    }

    /// Takes a token now, or says how long until one is due. The token is taken either way, so
    /// a waiter that comes back after the delay owns it: no thundering herd.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= 1.0;
        let wait = if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        };
        self.last_due = now + wait;
        wait
    }

    /// Gives back the token of a reservation due at `due` (`now` + what [`TokenBucket::reserve`]
    /// said) whose request was given up before then, as client-go's limiter (x/time/rate's
    /// `Reservation.Cancel`): as much of it as no later reservation already counts on, so
    /// requests dropped while they wait do not spend the budget of those that follow.
    pub fn cancel(&mut self, due: Instant, now: Instant) {
        if due <= now {
            return;
        }
        let counted_on = self.last_due.saturating_duration_since(due).as_secs_f64() * self.qps;
        let restore = 1.0 - counted_on;
        if restore <= 0.0 {
            return;
        }
        self.refill(now);
        self.tokens = (self.tokens + restore).min(self.burst);
        if due == self.last_due {
            let before = due.checked_sub(Duration::from_secs_f64(1.0 / self.qps));
            if let Some(before) = before.filter(|b| *b >= now) {
                self.last_due = before;
            }
        }
    }

    /// Takes a token if one is there now; never waits and takes nothing otherwise. For a caller
    /// that has a cheaper answer than waiting (a budget of its own that refuses when spent).
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A [`TokenBucket`] shared by clones, that refuses instead of waiting: the budget of calls a
/// caller without credentials can cause (the webhook's pod lookups, the admin server's
/// TokenReviews). `qps <= 0` means unlimited.
#[derive(Clone, Debug)]
pub struct Budget {
    bucket: Option<Arc<Mutex<TokenBucket>>>,
}

impl Budget {
    pub fn new(qps: f32, burst: u32) -> Self {
        Self {
            bucket: (qps > 0.0).then(|| Arc::new(Mutex::new(TokenBucket::new(qps, burst)))),
        }
    }

    /// Whether one more call fits in the budget now (and counts it when it does).
    pub fn try_take(&self) -> bool {
        match &self.bucket {
            None => true,
            Some(b) => b
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .try_take(Instant::now()),
        }
    }
}

/// The process's token bucket as a tower layer: every request of the clients it wraps takes a
/// token when it is sent and waits for it in its own future, as client-go's `rate.Limiter.Wait`
/// (requests waiting in line behind others would be timed from the head of the line only).
/// Each wait is observed in client-go's `rest_client_rate_limiter_duration_seconds{verb,host}`
/// ([`crate::client::restclient`]), zero when a token was there, so client-side throttling shows.
#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<TokenBucket>>,
    host: Arc<str>,
}

impl RateLimitLayer {
    /// `qps <= 0` means unlimited, as in client-go (and nothing is observed, as there).
    pub fn new(qps: f32, burst: u32) -> Option<Self> {
        (qps > 0.0).then(|| Self {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst))),
            host: "none".into(),
        })
    }

    /// The same bucket, its waits observed under `host` (the apiserver's `host:port`, as the
    /// other REST client metrics label it).
    pub fn for_host(&self, host: &str) -> Self {
        Self {
            bucket: self.bucket.clone(),
            host: host.into(),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            bucket: self.bucket.clone(),
            host: self.host.clone(),
        }
    }
}

/// Always ready: a request is let through to the service it wraps once its token is due.
/// That service is shared by the waiting requests, each holding it only to hand its request
/// over (kube's client stack is not `Clone`; a waiting request holds nothing).
pub struct RateLimit<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    bucket: Arc<Mutex<TokenBucket>>,
    host: Arc<str>,
}

impl<S> Clone for RateLimit<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            bucket: self.bucket.clone(),
            host: self.host.clone(),
        }
    }
}

/// One request's wait for its token, observed when it ends (or the request is dropped while
/// waiting: client-go observes a cancelled wait too, and gives the token back).
struct Waiting {
    started: Instant,
    due: Instant,
    bucket: Arc<Mutex<TokenBucket>>,
    verb: http::Method,
    host: Arc<str>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let now = Instant::now();
        if now < self.due {
            self.bucket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .cancel(self.due, now);
        }
        crate::client::restclient::metrics()
            .rate_limiter
            .with_label_values(&[self.verb.as_str(), &self.host])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// Whether a request asks for the next page of a list (`continue=` with a token). Such a page
/// is part of the list whose first request paid its token, and it is not charged again: a list
/// costs one token however many pages it has. Watches list consistently in pages of a bounded
/// size to keep memory low, where client-go's informers take one answer from the watch cache;
/// charged per page, a large cluster's first list spent most of its time waiting on this
/// bucket (docs/benchmarks.md, the start row). The pages a list has are bounded by what it
/// lists, and the apiserver's priority and fairness still counts every one.
fn is_continuation(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&').any(|pair| {
            pair.strip_prefix("continue=")
                .is_some_and(|t| !t.is_empty())
        })
    })
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<Request<B>> for RateLimit<S>
where
    S: Service<Request<B>> + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let started = Instant::now();
        let wait = match is_continuation(req.uri()) {
            true => Duration::ZERO,
            false => self
                .bucket
                .lock()
                .expect("token bucket lock")
                .reserve(started),
        };
        let waiting = Waiting {
            started,
            due: started + wait,
            bucket: self.bucket.clone(),
            verb: req.method().clone(),
            host: self.host.clone(),
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            drop(waiting);
            let mut inner = inner.lock().await;
            let sent = ServiceExt::<Request<B>>::ready(&mut *inner)
                .await?
                .call(req);
            drop(inner);
            sent.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3);
        for _ in 0..3 {
            assert_eq!(b.reserve(t0), Duration::ZERO);
        }
        // The fourth and fifth wait one and two token periods (100 ms each at 10 qps).
        let w4 = b.reserve(t0);
        let w5 = b.reserve(t0);
        assert!((w4.as_secs_f64() - 0.1).abs() < 1e-9, "{w4:?}");
        assert!((w5.as_secs_f64() - 0.2).abs() < 1e-9, "{w5:?}");
        // A second later the bucket is full again, but never above burst.
        let t1 = t0 + Duration::from_secs(10);
        for _ in 0..3 {
            assert_eq!(b.reserve(t1), Duration::ZERO);
        }
        assert!(b.reserve(t1) > Duration::ZERO);
    }

    fn get(path: &str) -> Request<()> {
        Request::builder().uri(path).body(()).unwrap()
    }

    /// A service that answers each request with its path, after `answer_in` (paused time).
    fn echo(
        answer_in: Duration,
    ) -> impl Service<
        Request<()>,
        Response = String,
        Error = (),
        Future = impl Future<Output = Result<String, ()>> + Send,
    > + Send
    + 'static {
        tower::service_fn(move |r: Request<()>| async move {
            tokio::time::sleep(answer_in).await;
            Ok::<_, ()>(r.uri().path().to_string())
        })
    }

    /// A list's next pages ride on the token of its first request; every other request, a
    /// first page included, waits for its own.
    #[tokio::test(start_paused = true)]
    async fn a_lists_next_pages_take_no_token() {
        let layer = RateLimitLayer::new(1.0, 1).unwrap();
        let mut svc = layer.layer(echo(Duration::ZERO));
        let start = Instant::now();
        let mut send = async |uri: &str| {
            svc.ready().await.unwrap().call(get(uri)).await.unwrap();
            start.elapsed()
        };
        assert_eq!(send("/api/v1/pods?limit=100").await, Duration::ZERO);
        for page in 0..50 {
            let uri = format!("/api/v1/pods?limit=100&continue=eyJ2{page}");
            assert_eq!(send(&uri).await, Duration::ZERO, "page {page}");
        }
        // The bucket is empty: a new list, a GET and an empty token each wait a second more.
        assert_eq!(
            send("/api/v1/nodes?limit=100").await,
            Duration::from_secs(1)
        );
        assert_eq!(
            send("/api/v1/namespaces/a/pods/p").await,
            Duration::from_secs(2)
        );
        assert_eq!(
            send("/api/v1/pods?limit=100&continue=").await,
            Duration::from_secs(3)
        );
        assert_eq!(
            send("/api/v1/pods?xcontinue=a").await,
            Duration::from_secs(4)
        );
    }

    #[test]
    fn continuation_is_a_continue_pair_with_a_token() {
        let c = |u: &str| is_continuation(&u.parse().unwrap());
        assert!(c("/api/v1/pods?limit=500&continue=abc"));
        assert!(c("/api/v1/pods?continue=abc&limit=500"));
        assert!(!c("/api/v1/pods?limit=500"));
        assert!(!c("/api/v1/pods?limit=500&continue="));
        assert!(!c("/api/v1/pods?labelSelector=continue%3Dabc"));
        assert!(!c("/api/v1/pods"));
    }

    #[tokio::test(start_paused = true)]
    async fn service_waits_for_tokens() {
        let layer = RateLimitLayer::new(5.0, 1).unwrap();
        let mut svc = layer.layer(echo(Duration::ZERO));
        let start = Instant::now();
        for i in 0..6 {
            let path = format!("/{i}");
            let out = svc.ready().await.unwrap().call(get(&path)).await.unwrap();
            assert_eq!(out, path);
        }
        // One from the burst, five more at 5 qps: one second.
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    /// A burst sent at once over a low QPS: each request takes its token as it is sent and
    /// waits its own turn (0, 0.2, … 1 s at 5 qps after a burst of one), all are answered by
    /// the last one's turn, and each wait is observed in
    /// `rest_client_rate_limiter_duration_seconds` under the request's verb and the host.
    #[tokio::test(start_paused = true)]
    async fn a_burst_waits_and_every_wait_is_observed() {
        let host = "10.0.0.9:6443";
        let observed = |verb: &str| {
            let h = crate::client::restclient::metrics()
                .rate_limiter
                .with_label_values(&[verb, host]);
            (h.get_sample_count(), h.get_sample_sum())
        };
        assert_eq!(observed("GET"), (0, 0.0));
        let layer = RateLimitLayer::new(5.0, 1).unwrap().for_host(host);
        let svc = layer.layer(echo(Duration::from_millis(10)));
        let start = Instant::now();
        let sent: Vec<_> = (0..6)
            .map(|i| {
                let mut svc = svc.clone();
                svc.call(get(&format!("/{i}")))
            })
            .collect();
        let answers = futures::future::join_all(sent).await;
        let want: Vec<Result<String, ()>> = (0..6).map(|i| Ok(format!("/{i}"))).collect();
        assert_eq!(answers, want);
        // The last token is due at 1 s; the answers take 10 ms each, side by side.
        assert_eq!(start.elapsed(), Duration::from_millis(1010));
        let (count, sum) = observed("GET");
        assert_eq!(count, 6);
        // 0 + 0.2 + 0.4 + 0.6 + 0.8 + 1.0
        assert!((sum - 3.0).abs() < 1e-6, "{sum}");
        let h = crate::client::restclient::metrics()
            .rate_limiter
            .with_label_values(&["GET", host]);
        let m = prometheus::core::Metric::metric(&h);
        let buckets = m.get_histogram().get_bucket();
        let upto = |le: f64| {
            buckets
                .iter()
                .find(|b| b.upper_bound() == le)
                .unwrap()
                .cumulative_count()
        };
        assert_eq!(upto(0.005), 1, "only the burst's token was there at once");
        assert_eq!(upto(0.25), 2);
        assert_eq!(upto(1.0), 6);
        assert_eq!(observed("POST"), (0, 0.0), "another verb is another series");
    }

    /// x/time/rate's cancel: a reservation given up before it is due gives back what no later
    /// reservation counts on; one already due gives back nothing.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_reservation_gives_back_its_token() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 1);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        let ms = |d: Duration| d.as_millis();
        let w2 = b.reserve(t0);
        let w3 = b.reserve(t0);
        assert_eq!((ms(w2), ms(w3)), (100, 200));
        // The second's token is counted on by the third: nothing to give back.
        b.cancel(t0 + w2, t0);
        // The last one's is: the next reservation takes its turn.
        b.cancel(t0 + w3, t0);
        assert_eq!(ms(b.reserve(t0)), 200);
        // Already due: the token was spent.
        let t1 = t0 + Duration::from_secs(1);
        b.cancel(t0 + Duration::from_millis(200), t1);
        assert_eq!(b.reserve(t1), Duration::ZERO);
        assert_eq!(ms(b.reserve(t1)), 100);
    }

    /// A request given up while it waits for its token is observed too, for as long as it
    /// waited, and the next request takes its turn.
    #[tokio::test(start_paused = true)]
    async fn a_wait_given_up_is_observed() {
        let host = "10.0.0.10:6443";
        let layer = RateLimitLayer::new(1.0, 1).unwrap().for_host(host);
        let mut svc = layer.layer(echo(Duration::ZERO));
        svc.call(get("/first")).await.unwrap();
        let waiting = svc.call(get("/second"));
        assert!(
            tokio::time::timeout(Duration::from_millis(300), waiting)
                .await
                .is_err()
        );
        let h = crate::client::restclient::metrics()
            .rate_limiter
            .with_label_values(&["GET", host]);
        assert_eq!(h.get_sample_count(), 2);
        assert!(
            (h.get_sample_sum() - 0.3).abs() < 1e-6,
            "{}",
            h.get_sample_sum()
        );
        let start = Instant::now();
        svc.call(get("/third")).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(700));
    }

    /// The budget never goes below zero: a refused call costs nothing, so once the flood stops
    /// the next call is allowed after one token period, however many were refused.
    #[tokio::test(start_paused = true)]
    async fn budget_refuses_without_debt() {
        let budget = Budget::new(10.0, 3);
        let taken = (0..1000).filter(|_| budget.try_take()).count();
        assert_eq!(taken, 3, "the burst, then refusals");
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(budget.try_take(), "one token period later");
        assert!(!budget.try_take());
        tokio::time::advance(Duration::from_secs(60)).await;
        let taken = (0..1000).filter(|_| budget.try_take()).count();
        assert_eq!(taken, 3, "refilled to the burst, never above");
        let unlimited = Budget::new(0.0, 1);
        assert!((0..1000).all(|_| unlimited.try_take()));
    }

    #[test]
    fn zero_qps_is_unlimited() {
        assert!(RateLimitLayer::new(0.0, 10).is_none());
    }
}
