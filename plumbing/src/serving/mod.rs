//! Serving HTTP to callers who may be hostile, at a bounded cost: connections, TLS handshakes,
//! the time to send headers and a body, body sizes, and requests in flight are all capped, in
//! all and per source address, and every cap answers at once in a way a client understands (a
//! connection closed, 429 with `Retry-After`, 413, 408, 503): nothing waits in the kernel's
//! backlog behind a cap. The sysctl webhook and the admin server (`/metrics`, `/healthz`,
//! `/readyz`) both serve this way: one on every pod's reach, the other on the host network.
//!
//! - `listener.rs`: the port, the certificate served (swapped in place), the TLS handshakes.
//! - `sources.rs`: who holds the connections, by source address, and what a new one gets at a
//!   cap (kubelet's probes find room however many connections others hold).
//! - `guard.rs`: the request limits, and the HTTP/1.1 connections with their timeouts.
//! - `body.rs`: receiving a request body within its deadline and at its minimum rate.
//! - `self_signed.rs`: a certificate of the process's own, when none is given.
//! - `probe.rs`: `controller-manager probe URL...`, the helm test's client.
//! - `admin.rs`: the admin server both binaries run (`/healthz`, `/readyz`, `/metrics`, who may
//!   read `/metrics` asked of `crate::metrics_auth`), served as above.

use std::time::Duration;

use prometheus::{IntCounterVec, IntGauge};

pub mod admin;
pub mod body;
pub mod guard;
pub mod listener;
pub mod probe;
pub mod self_signed;
pub mod sources;

#[cfg(test)]
mod admin_tests;
#[cfg(test)]
mod sources_tests;

pub use guard::{limited, serve};
pub use listener::{Accepted, Certificates, Listener, server_config};

/// Binds `addr` now (a port clash fails start-up, naming `flag`) and returns where it listens
/// and the task that serves `app` (a router behind [`limited`], in whole or in part) on it,
/// over TLS with `tls`, within `limits`, until `token` is cancelled.
pub async fn bind(
    addr: std::net::SocketAddr,
    flag: &str,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    app: axum::Router,
    limits: Limits,
    counters: Counters,
    token: tokio_util::sync::CancellationToken,
) -> std::io::Result<(std::net::SocketAddr, impl Future<Output = ()> + use<>)> {
    let listener =
        Listener::bind(addr, flag, tls, &limits, counters.clone(), token.clone()).await?;
    let local = listener.local_addr();
    Ok((local, async move {
        serve(listener, app, &limits, counters, token).await
    }))
}

/// hyper's read buffer per connection (its default grows to 400 KiB): headers must fit.
pub const READ_BUFFER: usize = 64 << 10;

/// The limits of one server.
#[derive(Clone, Debug)]
pub struct Limits {
    /// What the server is called in its logs and in the answers it refuses with.
    pub name: &'static str,
    /// Connections open at once (TLS and HTTP buffers each). A connection over a cap is
    /// accepted and closed at once, or takes the place of one doing nothing (`sources.rs`).
    pub connections: usize,
    /// Connections open at once from one source address.
    pub source_connections: usize,
    /// TLS handshakes in progress at once (each costs a signature), each in its own task.
    pub handshakes: usize,
    /// TLS handshakes in progress at once from one source address.
    pub source_handshakes: usize,
    /// A handshake not done in this time from the connection's accept is dropped.
    pub handshake_timeout: Duration,
    /// Headers not received in this time from the moment the server waits for them (a new
    /// connection, or a kept-alive one between requests) close the connection: this is also
    /// the idle timeout. A deadline, not reset by each byte.
    pub header_timeout: Duration,
    /// A body not received in this time: 408, and the connection closed.
    pub body_timeout: Duration,
    /// A body's first part may come at any pace for this long; from then on it must keep
    /// [`Limits::body_min_rate`] on average since the grace, or get 408.
    pub body_grace: Duration,
    /// Bytes per second a body must average after its grace.
    pub body_min_rate: u64,
    /// Bodies still arriving after their grace, at once: one more gets 408 at its grace.
    pub slow_bodies: usize,
    /// The rest of a request (judging it, an API call it makes): 503 after this.
    pub answer_timeout: Duration,
    /// Bodies over this are refused with 413, unread.
    pub max_body: usize,
    /// Requests that declare a body up to this size take the wide lane.
    pub small_body: usize,
    /// Requests in flight in the wide lane.
    pub small_in_flight: usize,
    /// Requests in flight in the wide lane from one source address; over it, 429 at once.
    pub source_in_flight: usize,
    /// Requests in flight in the narrow lane (bodies over `small_body`, or of no declared
    /// length), being received or answered; one per source address (over it, 429 at once).
    pub large_in_flight: usize,
    /// Of those, answered (parsed, judged) at once, once received: what bounds the memory
    /// that parsing large bodies holds.
    pub large_answering: usize,
    /// How long a request waits for its lane before 429.
    pub queue_wait: Duration,
}

impl Limits {
    /// The connection caps of the listener.
    pub fn caps(&self) -> sources::Caps {
        sources::Caps {
            connections: self.connections,
            source_connections: self.source_connections,
            handshakes: self.handshakes,
            source_handshakes: self.source_handshakes,
        }
    }
}

/// What a server counts: refusals by reason (one of [`REFUSED_REASONS`], or a reason of the
/// server's own) and the connections open.
#[derive(Clone)]
pub struct Counters {
    pub refused: IntCounterVec,
    pub connections: IntGauge,
}

impl Counters {
    pub fn refused(&self, reason: &str) {
        self.refused.with_label_values(&[reason]).inc();
    }
}

/// Every `reason` a server of this module counts by itself.
pub const REFUSED_REASONS: [&str; 13] = [
    "body_too_large",
    "busy",
    "source_busy",
    "body_timeout",
    "body_too_slow",
    "answer_timeout",
    "header_timeout",
    "handshake_timeout",
    "connections",
    "source_connections",
    "handshakes",
    "source_handshakes",
    "replaced",
];
