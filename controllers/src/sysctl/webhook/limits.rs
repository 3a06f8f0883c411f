//! The limits of the webhook server (a `plumbing::serving` server), and what it counts when a
//! caller hits one.
//!
//! The port is reachable from every pod of the cluster (the apiserver calls it through a
//! Service) and asks for no credentials. A request over a cap gets 429 with `Retry-After`, which
//! client-go retries within the webhook's `timeoutSeconds`; a review that gets no answer at all
//! is decided by the webhook's `failurePolicy`, as when no replica answers.

use std::time::Duration;

pub use groundskeeper_plumbing::serving::{Counters, Limits};

/// An AdmissionReview of a pod CREATE carries the pod as the apiserver decoded it. The
/// apiserver takes no request body over 3 MiB (`MaxRequestBodyBytes`), and etcd stores no
/// object over 1.5 MiB, so a pod that could ever run is under 3 MiB as JSON; the review wraps
/// it in a few KiB (uid, kinds, userInfo, options). A binding's review is about 1 KiB.
pub const MAX_BODY: usize = (3 << 20) + (64 << 10);
/// Every binding, and a pod of ordinary size, fits here; larger bodies take the narrow lane.
pub const SMALL_BODY: usize = 64 << 10;
/// The limits the webhook serves with; tests shorten the times.
pub fn limits() -> Limits {
    Limits {
        name: "groundskeeper sysctl webhook",
        connections: 256,
        // One apiserver is one source: room for a burst of reviews on new connections (its
        // client keeps 25 idle ones), and for the caller it shares nothing with.
        source_connections: 128,
        handshakes: 128,
        source_handshakes: 64,
        // The apiserver may call through a tunnel (konnectivity): more than one round trip.
        handshake_timeout: Duration::from_secs(2),
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(5),
        // The apiserver sends a review in one go; a body a byte at a time holds its lane a
        // second at most.
        body_grace: Duration::from_secs(1),
        body_min_rate: 256 << 10,
        slow_bodies: 8,
        // Judging a review, a pod lookup: the apiserver gave up long before (`timeoutSeconds`,
        // at most 30, 5 in the chart).
        answer_timeout: Duration::from_secs(10),
        max_body: MAX_BODY,
        small_body: SMALL_BODY,
        // Bindings and ordinary pods take the wide lane; larger bodies are received four at a
        // time (one per source) and parsed one at a time.
        small_in_flight: 64,
        source_in_flight: 32,
        large_in_flight: 4,
        large_answering: 1,
        queue_wait: Duration::from_secs(1),
    }
}

/// Every value of the `reason` label.
pub fn refused_reasons() -> impl Iterator<Item = &'static str> {
    groundskeeper_plumbing::serving::REFUSED_REASONS
        .into_iter()
        .chain(["lookup_budget"])
}
