//! The gate webhook's endpoint, `/mutate/pod`: reads the AdmissionReview of a pod CREATE and
//! answers with [`gate::gating`]'s patch. Served beside the validating endpoints, on the same
//! listener and certificate. It reads only whether anything enforces (the SysctlPolicies, once
//! listed), so it answers before the watches have listed: it gates meanwhile.

use std::sync::Arc;

use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};

use super::decide::anything_enforces;
use super::gate::{self, Enforcement, Gating};
use super::review;
use super::serve::Reviewer;

/// The target of this file's log lines, which `RUST_LOG` filters select by: named after
/// the component (`sysctlwebhook`), wherever its code sits.
const LOG_TARGET: &str = "groundskeeper_controllers::sysctlwebhook::mutate";

/// An AdmissionReview carries the whole pod; the apiserver caps objects at about 1.5 MiB.
const BODY_LIMIT: usize = 4 << 20;

pub fn router(reviewer: Arc<Reviewer>) -> Router {
    Router::new()
        .route("/mutate/pod", post(handle))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(reviewer)
}

/// `/mutate/pod`: reads the AdmissionReview, answers allowed with the gate's patch (or, under
/// `--dry-run`, without it and with a warning that says so).
pub async fn handle(State(reviewer): State<Arc<Reviewer>>, body: Bytes) -> Response {
    let start = std::time::Instant::now();
    let count = |result: &str| {
        reviewer
            .metrics
            .reviews
            .with_label_values(&["gate", result])
            .inc()
    };
    let (allowed, pod) = match review::read_created_pod(&body) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(target: LOG_TARGET, error = %e, "webhook: unreadable request");
            count("unreadable");
            reviewer
                .metrics
                .errors
                .with_label_values(&["unreadable"])
                .inc();
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    let enforcement = {
        let c = reviewer.cache.lock();
        if !c.policies.listed() {
            Enforcement::Unknown
        } else if anything_enforces(&reviewer.args, &c.policies.values().collect::<Vec<_>>()) {
            Enforcement::Possible
        } else {
            Enforcement::Nowhere
        }
    };
    let gating = pod
        .as_deref()
        .map_or(Gating::Pass("not a pod CREATE"), |p| {
            gate::gating(p, &reviewer.args, enforcement)
        });
    let what = pod
        .as_deref()
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata
                    .name
                    .as_deref()
                    .or(p.metadata.generate_name.as_deref())
                    .unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let (patch, warnings, result) = super::apply::gate(gating, reviewer.dry_run, &what);
    count(result);
    reviewer
        .metrics
        .duration
        .with_label_values(&["gate"])
        .observe(start.elapsed().as_secs_f64());
    match review::respond_patched(allowed, patch.as_ref(), &warnings) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => {
            // Never answered without the gate it owes: the apiserver's failurePolicy decides.
            tracing::warn!(target: LOG_TARGET, error = %e, "webhook: could not answer");
            reviewer.metrics.errors.with_label_values(&["other"]).inc();
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        }
    }
}
