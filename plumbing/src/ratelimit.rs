//! A client-side token bucket for API requests, as client-go's `--kube-api-qps/--kube-api-burst`:
//! a burst of `burst` requests, then `qps` per second. kube-rs has none of its own.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(qps: f32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: f64::from(qps),
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Takes a token now, or says how long until one is due. The token is taken either way, so
    /// a waiter that comes back after the delay owns it: no thundering herd.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }

    /// Takes a token if one is there now; never waits and takes nothing otherwise. For a caller
    /// that has a cheaper answer than waiting (a budget of its own that refuses when spent).
    pub fn try_take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
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

#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl RateLimitLayer {
    /// `qps <= 0` means unlimited, as in client-go.
    pub fn new(qps: f32, burst: u32) -> Option<Self> {
        (qps > 0.0).then(|| Self {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst))),
        })
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            reserved: false,
            sleep: None,
        }
    }
}

pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    reserved: bool,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.reserved {
            let wait = self
                .bucket
                .lock()
                .expect("token bucket lock")
                .reserve(Instant::now());
            self.reserved = true;
            if !wait.is_zero() {
                self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
            }
        }
        if let Some(sleep) = self.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.reserved = false;
        self.inner.call(req)
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

    #[tokio::test(start_paused = true)]
    async fn service_waits_for_tokens() {
        let layer = RateLimitLayer::new(5.0, 1).unwrap();
        let mut svc = layer.layer(tower::service_fn(|x: u32| async move { Ok::<_, ()>(x) }));
        let start = Instant::now();
        for i in 0..6 {
            use tower::ServiceExt;
            let out = svc.ready().await.unwrap().call(i).await.unwrap();
            assert_eq!(out, i);
        }
        // One from the burst, five more at 5 qps: one second.
        assert_eq!(start.elapsed(), Duration::from_secs(1));
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
