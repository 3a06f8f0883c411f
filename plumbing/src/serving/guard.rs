//! What a caller can cost a server, bounded: the time to send headers and a body, body sizes,
//! and requests in flight (the connections and handshakes are capped by the listener).
//!
//! Whatever one connection may hold, a hostile caller can hold many times over, so every
//! limit answers in a way an HTTP client understands: a request over the cap gets 429 with
//! `Retry-After` (client-go retries it), a body too large gets 413 unread, and what does not
//! arrive in time is dropped.

use std::sync::Arc;

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{Counters, Limits, READ_BUFFER, listener::Listener};

struct Lanes {
    small: Semaphore,
    large: Semaphore,
    limits: Limits,
    counters: Counters,
}

/// `router` behind the request limits: size, lane, body deadline, answer deadline.
pub fn limited(router: Router, limits: &Limits, counters: Counters) -> Router {
    let lanes = Arc::new(Lanes {
        small: Semaphore::new(limits.small_in_flight),
        large: Semaphore::new(limits.large_in_flight),
        limits: limits.clone(),
        counters,
    });
    router.layer(middleware::from_fn_with_state(lanes, admit))
}

fn refusal(name: &str, status: StatusCode, why: &str) -> Response {
    let mut r = (status, format!("{name}: {why}\n")).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    if matches!(
        status,
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
    ) {
        // The body is left unread: the connection can not carry another request.
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

async fn admit(State(lanes): State<Arc<Lanes>>, req: Request, next: Next) -> Response {
    let l = &lanes.limits;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > l.max_body as u64) {
        lanes.counters.refused("body_too_large");
        return refusal(
            l.name,
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
        );
    }
    let lane = match declared {
        Some(n) if n <= l.small_body as u64 => &lanes.small,
        _ => &lanes.large,
    };
    let Ok(Ok(_permit)) = tokio::time::timeout(l.queue_wait, lane.acquire()).await else {
        lanes.counters.refused("busy");
        return refusal(
            l.name,
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests in flight",
        );
    };
    let (parts, body) = req.into_parts();
    let bytes =
        match tokio::time::timeout(l.body_timeout, axum::body::to_bytes(body, l.max_body)).await {
            Ok(Ok(b)) => b,
            Ok(Err(_)) => {
                // Over the limit without saying so up front (chunked), or the body broke off.
                lanes.counters.refused("body_too_large");
                return refusal(
                    l.name,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body too large or cut",
                );
            }
            Err(_) => {
                lanes.counters.refused("body_timeout");
                return refusal(
                    l.name,
                    StatusCode::REQUEST_TIMEOUT,
                    "request body not received in time",
                );
            }
        };
    let req = Request::from_parts(parts, Body::from(bytes));
    match tokio::time::timeout(l.answer_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => {
            lanes.counters.refused("answer_timeout");
            refusal(l.name, StatusCode::SERVICE_UNAVAILABLE, "no answer in time")
        }
    }
}

/// Serves `router` (already [`limited`]) on the connections `listener` hands over, each with
/// the header and idle timeout, until `token` is cancelled; then lets the requests in flight
/// finish (each bounded by the limits) and closes idle connections.
pub async fn serve(
    mut listener: Listener,
    router: Router,
    limits: &Limits,
    counters: Counters,
    token: CancellationToken,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(READ_BUFFER)
        .keep_alive(true);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = token.cancelled() => break,
            a = listener.accept() => a,
        };
        let Some(accepted) = accepted else { break };
        let conn = http.serve_connection(
            TokioIo::new(accepted.stream),
            TowerToHyperService::new(router.clone()),
        );
        let (token, counters, name) = (token.clone(), counters.clone(), limits.name);
        counters.connections.inc();
        connections.spawn(async move {
            let _slot = accepted.slot;
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                _ = token.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            counters.connections.dec();
            if let Err(e) = ended {
                if e.is_timeout() {
                    counters.refused("header_timeout");
                }
                tracing::debug!(peer = %accepted.peer, error = %e, "{name}: connection ended");
            }
        });
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
}
