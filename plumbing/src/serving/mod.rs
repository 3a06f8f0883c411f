//! Serving HTTP to callers who may be hostile, at a bounded cost: connections, TLS handshakes,
//! the time to send headers and a body, body sizes, and requests in flight are all capped, and
//! every cap answers in a way an HTTP client understands (the kernel's backlog, 429 with
//! `Retry-After`, 413, 408, 503). The sysctl webhook and the admin server (`/metrics`,
//! `/healthz`, `/readyz`) both serve this way: one on every pod's reach, the other on the host
//! network.
//!
//! - `listener.rs`: the port, the certificate served (swapped in place), the TLS handshakes.
//! - `guard.rs`: the request limits, and the HTTP/1.1 connections with their timeouts.
//! - `self_signed.rs`: a certificate of the process's own, when none is given.
//! - `probe.rs`: `controller-manager probe URL...`, the helm test's client.

use std::time::Duration;

use prometheus::{IntCounterVec, IntGauge};

pub mod guard;
pub mod listener;
pub mod probe;
pub mod self_signed;

pub use guard::{limited, serve};
pub use listener::{Accepted, Certificates, Listener, server_config};

/// hyper's read buffer per connection (its default grows to 400 KiB): headers must fit.
pub const READ_BUFFER: usize = 64 << 10;

/// The limits of one server.
#[derive(Clone, Debug)]
pub struct Limits {
    /// What the server is called in its logs and in the answers it refuses with.
    pub name: &'static str,
    /// Connections open at once (TLS and HTTP buffers each); at the cap, new connections wait
    /// in the kernel's accept backlog until one closes.
    pub connections: usize,
    /// TLS handshakes in progress at once (each costs a signature); at the cap, accepting
    /// waits.
    pub handshakes: usize,
    /// A handshake not done in this time is dropped.
    pub handshake_timeout: Duration,
    /// Headers not received in this time from the moment the server waits for them (a new
    /// connection, or a kept-alive one between requests) close the connection: this is also
    /// the idle timeout.
    pub header_timeout: Duration,
    /// A body not received in this time: 408, and the connection closed.
    pub body_timeout: Duration,
    /// The rest of a request (judging it, an API call it makes): 503 after this.
    pub answer_timeout: Duration,
    /// Bodies over this are refused with 413, unread.
    pub max_body: usize,
    /// Requests that declare a body up to this size take the wide lane.
    pub small_body: usize,
    /// Requests in flight in the wide lane.
    pub small_in_flight: usize,
    /// Requests in flight in the narrow lane (bodies over `small_body`, or of no declared
    /// length): what bounds the memory that large bodies hold at once.
    pub large_in_flight: usize,
    /// How long a request waits for its lane before 429.
    pub queue_wait: Duration,
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
pub const REFUSED_REASONS: [&str; 6] = [
    "body_too_large",
    "busy",
    "body_timeout",
    "answer_timeout",
    "header_timeout",
    "handshake_timeout",
];
