//! The webhook's HTTPS endpoints: `/validate/binding` and `/validate/pod` read an
//! AdmissionReview, judge it on the cache, and answer.
//!
//! Until every watch has listed, requests get HTTP 503: the apiserver then applies the
//! webhook's failurePolicy (Ignore: allowed; Fail: refused), as it does when no replica
//! answers at all.

use std::sync::Arc;

use axum::{
    Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use groundskeeper_plumbing::cache::Shared;
use groundskeeper_sysctl::args::PolicyArgs;
use groundskeeper_sysctl::crd::SysctlPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use super::apply::{self, Outcome};
use super::cache::Cache;
use super::decide::{PodView, decide};
use super::metrics::Metrics;
use super::review::{self, Answer, Subject};
use groundskeeper_plumbing::cache::Health;

/// An AdmissionReview carries the whole pod; the apiserver caps objects at about 1.5 MiB.
const BODY_LIMIT: usize = 4 << 20;

pub struct Judge {
    pub args: PolicyArgs,
    pub dry_run: bool,
    pub cache: Shared<Cache>,
    pub health: Health,
    pub client: kube::Client,
    pub metrics: Metrics,
}

pub fn router(judge: Arc<Judge>) -> Router {
    Router::new()
        .route("/validate/binding", post(handle))
        .route("/validate/pod", post(handle))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(judge)
}

async fn handle(State(judge): State<Arc<Judge>>, body: Bytes) -> Response {
    let start = std::time::Instant::now();
    if !judge.health.listed() {
        judge.count("unknown", "unavailable");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "groundskeeper sysctl webhook: caches not listed yet\n",
        )
            .into_response();
    }
    let (uid, subject) = match review::read(&body) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "webhook: unreadable request");
            judge.count("unknown", "unreadable");
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    let label = subject.label();
    let answer = judge.judge(subject).await;
    judge
        .metrics
        .duration
        .with_label_values(&[label])
        .observe(start.elapsed().as_secs_f64());
    match answer {
        Ok((answer, outcome)) => {
            judge.count(label, outcome.label());
            (
                [(header::CONTENT_TYPE, "application/json")],
                review::respond(&uid, &answer).to_string(),
            )
                .into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "webhook: could not judge the request");
            judge.count(label, "error");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        }
    }
}

impl Judge {
    fn count(&self, subject: &str, result: &str) {
        self.metrics
            .reviews
            .with_label_values(&[subject, result])
            .inc();
    }

    /// The answer for `subject`; an error only when a binding's pod could not be read.
    async fn judge(&self, subject: Subject) -> Result<(Answer, Outcome), kube::Error> {
        let (pod, view, node) = match subject {
            Subject::Other(what) => {
                tracing::debug!(request = %what, "webhook: not judged, allowed");
                return Ok(apply::answer(
                    super::decide::Decision::Allow,
                    self.dry_run,
                    &what,
                ));
            }
            Subject::Pod { pod, node } => {
                let name = format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                );
                (name, PodView::of(&pod), node)
            }
            Subject::Binding {
                namespace,
                name,
                uid,
                node,
            } => {
                let key = (namespace.clone(), name.clone());
                let cached = self.cache.lock().pending.get(&key).cloned();
                let view = match cached.filter(|v| uid.as_ref().is_none_or(|u| *u == v.uid)) {
                    Some(v) => v,
                    // Not seen by the watch yet (or another pod of the same name): read it.
                    None => match Api::<Pod>::namespaced(self.client.clone(), &namespace)
                        .get_opt(&name)
                        .await?
                    {
                        Some(p) => PodView::of(&p),
                        // Gone: the binding fails on its own.
                        None => PodView::default(),
                    },
                };
                (format!("{namespace}/{name}"), view, node)
            }
        };
        let decision = {
            let c = self.cache.lock();
            let policies: Vec<&SysctlPolicy> = c.policies.values().collect();
            decide(
                &self.args,
                &pod,
                &view,
                &node,
                c.nodes.get(&node),
                &policies,
            )
        };
        let what = format!("pod {pod} onto node {node}");
        Ok(apply::answer(decision, self.dry_run, &what))
    }
}
