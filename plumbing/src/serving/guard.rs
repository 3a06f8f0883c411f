//! What a caller can cost a server, bounded: the time to send headers and a body, body sizes,
//! and requests in flight, in all and per source address (the connections and handshakes are
//! capped by the listener).
//!
//! Whatever one connection may hold, a hostile caller can hold many times over, so every
//! limit answers in a way an HTTP client understands: a request over the cap gets 429 with
//! `Retry-After` (client-go retries it), a body too large gets 413 unread, and what does not
//! arrive in time is dropped.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::Service;

use super::body::{self, Pace, Refused};
use super::listener::{Accepted, Listener};
use super::sources::{self, Stage, Tally};
use super::{Counters, Limits, READ_BUFFER};

struct Lanes {
    small: Semaphore,
    large: Semaphore,
    answering: Semaphore,
    slow: Semaphore,
    /// Requests in flight per source, in the wide lane and in the narrow one.
    small_by_source: Arc<Tally>,
    large_by_source: Arc<Tally>,
    limits: Limits,
    counters: Counters,
}

/// The source address of a request's connection, set by [`serve`] on every request.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub IpAddr);

/// `router` behind the request limits: size, lane, body deadline and rate, answer deadline.
pub fn limited(router: Router, limits: &Limits, counters: Counters) -> Router {
    let lanes = Arc::new(Lanes {
        small: Semaphore::new(limits.small_in_flight),
        large: Semaphore::new(limits.large_in_flight),
        answering: Semaphore::new(limits.large_answering.max(1)),
        slow: Semaphore::new(limits.slow_bodies),
        small_by_source: Arc::default(),
        large_by_source: Arc::default(),
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
    // No length and no chunks: no body (a GET), which the wide lane takes.
    let bodiless = declared.is_none() && !req.headers().contains_key(header::TRANSFER_ENCODING);
    let small = bodiless || declared.is_some_and(|n| n <= l.small_body as u64);
    // A request with no connection behind it (a test calling the router) counts as one source.
    let source = req
        .extensions()
        .get::<Peer>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.0);
    let (lane, by_source, share) = match small {
        true => (&lanes.small, &lanes.small_by_source, l.source_in_flight),
        false => (&lanes.large, &lanes.large_by_source, 1),
    };
    let Some(_share) = by_source.take(source, share) else {
        lanes.counters.refused("source_busy");
        return refusal(
            l.name,
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests in flight from your address",
        );
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
    let pace = Pace {
        deadline: l.body_timeout,
        grace: l.body_grace,
        min_rate: l.body_min_rate,
        max: l.max_body,
    };
    let bytes = match body::receive(body, pace, &lanes.slow).await {
        Ok(b) => b,
        Err(Refused::TooLargeOrCut) => {
            // Over the limit without saying so up front (chunked), or the body broke off.
            lanes.counters.refused("body_too_large");
            return refusal(
                l.name,
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large or cut",
            );
        }
        Err(Refused::Timeout) => {
            lanes.counters.refused("body_timeout");
            return refusal(
                l.name,
                StatusCode::REQUEST_TIMEOUT,
                "request body not received in time",
            );
        }
        Err(Refused::TooSlow) => {
            lanes.counters.refused("body_too_slow");
            return refusal(
                l.name,
                StatusCode::REQUEST_TIMEOUT,
                "request body sent too slowly",
            );
        }
    };
    // A large body is held while it is parsed (several times its size): few at once.
    let _answering = match small {
        true => None,
        false => match tokio::time::timeout(l.queue_wait, lanes.answering.acquire()).await {
            Ok(Ok(p)) => Some(p),
            _ => {
                lanes.counters.refused("busy");
                return refusal(
                    l.name,
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many requests in flight",
                );
            }
        },
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
/// finish (each bounded by the limits) and closes idle connections. A connection is marked
/// busy while it answers a request (so no new connection replaces it), and closed at once when
/// a new one replaces it.
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
        let Accepted { stream, peer, slot } = accepted;
        let slot = Arc::new(slot);
        let service = {
            let (router, slot) = (router.clone(), slot.clone());
            tower::service_fn(move |mut req: http::Request<Incoming>| {
                slot.stage(Stage::Busy);
                req.extensions_mut()
                    .insert(Peer(sources::source(peer.ip())));
                let (answer, slot) = (router.clone().call(req.map(Body::new)), slot.clone());
                async move {
                    let r = answer.await;
                    slot.stage(Stage::Idle);
                    r
                }
            })
        };
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let (token, counters, name) = (token.clone(), counters.clone(), limits.name);
        counters.connections.inc();
        connections.spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                _ = slot.replaced().cancelled() => Ok(()),
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
                tracing::debug!(%peer, error = %e, "{name}: connection ended");
            }
        });
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
}
