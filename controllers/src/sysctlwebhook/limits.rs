//! The limits of the webhook server (see `server.rs`), and what it counts when a caller hits
//! one.

use std::time::Duration;

use prometheus::{IntCounterVec, IntGauge};

/// An AdmissionReview of a pod CREATE carries the pod as the apiserver decoded it. The
/// apiserver takes no request body over 3 MiB (`MaxRequestBodyBytes`), and etcd stores no
/// object over 1.5 MiB, so a pod that could ever run is under 3 MiB as JSON; the review wraps
/// it in a few KiB (uid, kinds, userInfo, options). A binding's review is about 1 KiB.
pub const MAX_BODY: usize = (3 << 20) + (64 << 10);
/// Every binding, and a pod of ordinary size, fits here; larger bodies take the narrow lane.
pub const SMALL_BODY: usize = 64 << 10;
/// hyper's read buffer per connection (its default grows to 400 KiB): headers must fit.
pub const READ_BUFFER: usize = 64 << 10;

/// The limits of one webhook server. [`Limits::default`] is what the binary serves with; tests
/// shorten the times.
#[derive(Clone, Debug)]
pub struct Limits {
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
    /// The rest of a request (judging it, a pod lookup): 503 after this; the apiserver gave up
    /// long before (`timeoutSeconds`, at most 30, 5 in the chart).
    pub answer_timeout: Duration,
    /// Bodies over this are refused with 413, unread.
    pub max_body: usize,
    /// Requests that declare a body up to this size take the wide lane.
    pub small_body: usize,
    /// Requests in flight in the wide lane (bindings, ordinary pods).
    pub small_in_flight: usize,
    /// Requests in flight in the narrow lane (bodies over `small_body`, or of no declared
    /// length): what bounds the memory that large bodies hold at once.
    pub large_in_flight: usize,
    /// How long a request waits for its lane before 429.
    pub queue_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 256,
            handshakes: 32,
            handshake_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(5),
            answer_timeout: Duration::from_secs(10),
            max_body: MAX_BODY,
            small_body: SMALL_BODY,
            small_in_flight: 64,
            large_in_flight: 1,
            queue_wait: Duration::from_secs(1),
        }
    }
}

/// What the server counts: `groundskeeper_sysctl_webhook_refused_total{reason}` and the open
/// connections.
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

/// Every value of the `reason` label.
pub const REFUSED_REASONS: [&str; 7] = [
    "body_too_large",
    "busy",
    "body_timeout",
    "answer_timeout",
    "header_timeout",
    "handshake_timeout",
    "lookup_budget",
];
