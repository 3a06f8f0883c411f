//! A deadline on every API request except watches. A watch is long-lived by design (the
//! server closes it after its timeoutSeconds); anything else that has not answered within the
//! deadline has hung and must fail, so that no controller waits forever on one call.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use http::Request;
use tower::{BoxError, Layer, Service};

#[derive(Clone, Copy)]
pub struct RequestTimeoutLayer(pub Duration);

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;
    fn layer(&self, inner: S) -> RequestTimeout<S> {
        RequestTimeout {
            inner,
            timeout: self.0,
        }
    }
}

#[derive(Clone)]
pub struct RequestTimeout<S> {
    inner: S,
    timeout: Duration,
}

/// True for `?watch=true` / `?watch=1` requests.
pub fn is_watch<B>(req: &Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<Request<B>> for RequestTimeout<S>
where
    S: Service<Request<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let deadline = (!is_watch(&req)).then_some(self.timeout);
        let what = format!("{} {}", req.method(), req.uri().path());
        let fut = self.inner.call(req);
        Box::pin(async move {
            match deadline {
                None => fut.await.map_err(Into::into),
                Some(d) => match tokio::time::timeout(d, fut).await {
                    Ok(r) => r.map_err(Into::into),
                    Err(_) => {
                        Err(format!("{what}: no answer within {d:?} (--kube-api-timeout)").into())
                    }
                },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    fn req(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn watch_detection() {
        assert!(is_watch(&req("/api/v1/pods?watch=true&resourceVersion=1")));
        assert!(is_watch(&req("/api/v1/pods?resourceVersion=1&watch=1")));
        assert!(!is_watch(&req("/api/v1/pods?limit=500")));
        assert!(!is_watch(&req("/api/v1/namespaces/watch/pods")));
    }

    #[tokio::test(start_paused = true)]
    async fn hung_request_times_out_but_watch_does_not() {
        let hang = tower::service_fn(|_r: Request<()>| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<_, BoxError>("late")
        });
        let svc = RequestTimeoutLayer(Duration::from_secs(30)).layer(hang);
        let e = svc
            .clone()
            .oneshot(req("/api/v1/nodes/n1"))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("GET /api/v1/nodes/n1") && e.to_string().contains("30s"),
            "{e}"
        );
        let w = svc.oneshot(req("/api/v1/nodes?watch=true")).await.unwrap();
        assert_eq!(w, "late");
    }
}
