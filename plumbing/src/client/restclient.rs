//! client-go's REST client metrics on every request of both binaries' Kubernetes clients, so
//! the dashboards and alerts built for Kubernetes components read ours:
//! `rest_client_requests_total{code,method,host}`,
//! `rest_client_request_duration_seconds{verb,host}` and, for the clients under the process's
//! QPS budget, `rest_client_rate_limiter_duration_seconds{verb,host}`, each request's wait for
//! a token (observed by [`crate::client::ratelimit`]) (component-base's
//! `metrics/prometheus/restclient`: names, help, labels and buckets).
//!
//! The metrics are process-wide, as client-go's are (one registration, every client counted in
//! it): a process has several clients (the shared one, the lease elector's, the webhook's), and
//! each registry built by [`crate::metrics::registry`] exposes the one set.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
    time::Instant,
};

use http::{Request, Response};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};
use tower::{Layer, Service};

/// client-go's latency buckets (seconds).
pub const DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The `code` of a request that got no answer (a connection or TLS failure, the request
/// deadline): client-go's, which keeps error texts out of the label.
pub const NO_ANSWER: &str = "<error>";

/// The three families, created once per process.
#[derive(Clone)]
pub struct RestClientMetrics {
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
    pub rate_limiter: HistogramVec,
}

/// The process's REST client metrics (registered in every registry by
/// [`crate::metrics::registry`]).
pub fn metrics() -> &'static RestClientMetrics {
    static METRICS: OnceLock<RestClientMetrics> = OnceLock::new();
    METRICS.get_or_init(|| RestClientMetrics {
        requests: IntCounterVec::new(
            Opts::new(
                "rest_client_requests_total",
                "Number of HTTP requests, partitioned by status code, method, and host.",
            ),
            &["code", "method", "host"],
        )
        .expect("rest_client_requests_total's name and labels are valid"),
        duration: HistogramVec::new(
            HistogramOpts::new(
                "rest_client_request_duration_seconds",
                "Request latency in seconds. Broken down by verb, and host.",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
            &["verb", "host"],
        )
        .expect("rest_client_request_duration_seconds's name and labels are valid"),
        rate_limiter: HistogramVec::new(
            HistogramOpts::new(
                "rest_client_rate_limiter_duration_seconds",
                "Client side rate limiter latency in seconds. Broken down by verb, and host.",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
            &["verb", "host"],
        )
        .expect("rest_client_rate_limiter_duration_seconds's name and labels are valid"),
    })
}

impl RestClientMetrics {
    /// The families, for a registry.
    pub fn collectors(&self) -> [Box<dyn prometheus::core::Collector>; 3] {
        [
            Box::new(self.requests.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.rate_limiter.clone()),
        ]
    }
}

/// Counts and times every request of the client it wraps. `host` is the apiserver's
/// `host:port` (the request URIs seen above kube's own layers carry only the path).
#[derive(Clone)]
pub struct RestClientMetricsLayer {
    host: Arc<str>,
    metrics: &'static RestClientMetrics,
}

impl RestClientMetricsLayer {
    pub fn new(host: &str) -> Self {
        Self {
            host: host.into(),
            metrics: metrics(),
        }
    }

    /// The layer of a client of `cluster_url`, labelled by [`host_label`].
    pub fn for_url(cluster_url: &http::Uri) -> Self {
        Self::new(host_label(cluster_url))
    }
}

/// The `host` label of a client of `cluster_url`: its `host:port`, as client-go's
/// `url.URL.Host`.
pub fn host_label(cluster_url: &http::Uri) -> &str {
    cluster_url.authority().map_or("none", |a| a.as_str())
}

impl<S> Layer<S> for RestClientMetricsLayer {
    type Service = RestClientMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RestClientMetricsService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RestClientMetricsService<S> {
    inner: S,
    layer: RestClientMetricsLayer,
}

/// One request on its way: counted as [`NO_ANSWER`] if dropped before an answer (a deadline
/// outside this layer, or the caller giving up), so no request goes uncounted.
struct InFlight {
    method: http::Method,
    host: Arc<str>,
    metrics: &'static RestClientMetrics,
    started: Instant,
    done: bool,
}

impl InFlight {
    /// Counts the answer (`Some(status)`) or its absence, and the time to it: to the response's
    /// headers, so a watch's time is that of its opening, not of its stream.
    fn finish(&mut self, status: Option<http::StatusCode>) {
        self.done = true;
        let code = status.map(|s| s.as_u16().to_string());
        let method = self.method.as_str();
        self.metrics
            .requests
            .with_label_values(&[code.as_deref().unwrap_or(NO_ANSWER), method, &self.host])
            .inc();
        self.metrics
            .duration
            .with_label_values(&[method, &self.host])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.done {
            self.finish(None);
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<Request<B>> for RestClientMetricsService<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let mut flight = InFlight {
            method: req.method().clone(),
            host: self.layer.host.clone(),
            metrics: self.layer.metrics,
            started: Instant::now(),
            done: false,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            flight.finish(result.as_ref().ok().map(Response::status));
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use tower::{BoxError, ServiceExt};

    fn count(code: &str, method: &str, host: &str) -> u64 {
        metrics()
            .requests
            .with_label_values(&[code, method, host])
            .get()
    }

    fn timed(verb: &str, host: &str) -> u64 {
        metrics()
            .duration
            .with_label_values(&[verb, host])
            .get_sample_count()
    }

    /// An apiserver stand-in answering each path with the status it names
    /// (`/status/404`), failing `/fail` without an answer, and never answering `/hang`.
    fn server() -> impl Service<
        Request<()>,
        Response = Response<()>,
        Error = BoxError,
        Future = impl Future<Output = Result<Response<()>, BoxError>> + Send,
    > + Clone {
        tower::service_fn(|req: Request<()>| async move {
            let path = req.uri().path().to_string();
            if path == "/fail" {
                return Err::<Response<()>, BoxError>("connection refused".into());
            }
            if path == "/hang" {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            let code: u16 = path
                .strip_prefix("/status/")
                .and_then(|c| c.parse().ok())
                .unwrap_or(200);
            Ok(Response::builder().status(code).body(()).unwrap())
        })
    }

    fn req(method: http::Method, path: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap()
    }

    /// Each request moves exactly its own series: the status code and method it had, the host
    /// of its client; the duration by verb and host. A request with no answer is `<error>`.
    #[tokio::test]
    async fn every_request_is_counted_by_code_method_and_host() {
        let host = "10.0.0.1:6443";
        let svc = RestClientMetricsLayer::new(host).layer(server());
        let cases: &[(http::Method, &str, &str)] = &[
            (http::Method::GET, "/status/200", "200"),
            (http::Method::GET, "/status/404", "404"),
            (http::Method::DELETE, "/status/429", "429"),
            (http::Method::PATCH, "/status/409", "409"),
            (http::Method::POST, "/status/201", "201"),
            (http::Method::PUT, "/status/503", "503"),
            (http::Method::GET, "/fail", NO_ANSWER),
        ];
        for (method, path, code) in cases {
            let before = count(code, method.as_str(), host);
            let timed_before = timed(method.as_str(), host);
            let _ = svc.clone().oneshot(req(method.clone(), path)).await;
            assert_eq!(
                count(code, method.as_str(), host),
                before + 1,
                "{method} {path}"
            );
            assert_eq!(
                timed(method.as_str(), host),
                timed_before + 1,
                "{method} {path}: timed"
            );
        }
        // Another client's host is another series, untouched by these.
        assert_eq!(count("200", "GET", "10.0.0.2:6443"), 0);
    }

    /// A request abandoned before its answer (a deadline in an outer layer, a cancelled
    /// caller) is counted once as `<error>`, as client-go counts a request that failed.
    #[tokio::test(start_paused = true)]
    async fn an_abandoned_request_is_counted_as_an_error() {
        let host = "10.0.0.3:6443";
        let svc = RestClientMetricsLayer::new(host).layer(server());
        let call = svc.oneshot(req(http::Method::GET, "/hang"));
        let abandoned = tokio::time::timeout(Duration::from_secs(30), call).await;
        assert!(abandoned.is_err(), "the request was left unanswered");
        assert_eq!(count(NO_ANSWER, "GET", host), 1);
        assert_eq!(count("200", "GET", host), 0);
    }

    #[test]
    fn the_host_label_is_the_servers_host_and_port() {
        for (url, host) in [
            ("https://10.96.0.1:443", "10.96.0.1:443"),
            ("https://kube.example:6443/", "kube.example:6443"),
            ("https://[fd00::1]:6443", "[fd00::1]:6443"),
            ("https://kube.example", "kube.example"),
        ] {
            let layer = RestClientMetricsLayer::for_url(&url.parse().unwrap());
            assert_eq!(&*layer.host, host, "{url}");
        }
    }
}
