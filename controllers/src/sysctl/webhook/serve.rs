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
use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::watch::cache::Shared;
use groundskeeper_sysctl_rules::args::PolicyArgs;
use groundskeeper_sysctl_rules::crd::SysctlPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use super::apply::{self, Outcome};
use super::decide::{decide, decide_unread};
use super::limits::{MAX_BODY, SMALL_BODY};
use super::metrics::Metrics;
use super::review::{self, Answer, Subject};
use crate::sysctl::cache::SysctlCache;
use crate::sysctl::facts::PodFacts;
use groundskeeper_plumbing::client::api_error_label;
use groundskeeper_plumbing::client::ratelimit::Budget;
use groundskeeper_plumbing::watch::cache::Health;

/// The target of this file's log lines, which `RUST_LOG` filters select by: named after
/// the component (`sysctlwebhook`), wherever its code sits.
const LOG_TARGET: &str = "groundskeeper_controllers::sysctlwebhook::serve";

/// The webhook's live reads of pods (a binding whose pod the cache does not have yet): a
/// client of their own, outside the token bucket the controllers share, and a budget of their
/// own. Anyone who reaches the port can send bindings of pods that do not exist; what that
/// costs the apiserver is this budget per replica, and it never delays PodGC or ServiceCIDR.
#[derive(Clone)]
pub struct Lookups {
    pub client: kube::Client,
    pub budget: Budget,
}

pub struct Reviewer {
    pub args: PolicyArgs,
    pub dry_run: bool,
    pub cache: Shared<SysctlCache>,
    pub health: Health,
    pub lookups: Lookups,
    pub metrics: Metrics,
}

/// Why a review got no verdict (HTTP 400 or 500: the webhook's failurePolicy decides).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error(transparent)]
    Unreadable(#[from] review::Unreadable),
    /// A binding's pod was not cached and could not be read.
    #[error("reading the bound pod: {0}")]
    ReadPod(#[source] kube::Error),
}

impl ReviewError {
    /// The `error` label of `groundskeeper_sysctl_webhook_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReviewError::Unreadable(_) => "unreadable",
            ReviewError::ReadPod(e) => api_error_label(e),
        }
    }
}

pub fn router(reviewer: Arc<Reviewer>) -> Router {
    Router::new()
        .route("/validate/binding", post(handle))
        .route("/validate/pod", post(handle))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(reviewer)
}

async fn handle(State(reviewer): State<Arc<Reviewer>>, body: Bytes) -> Response {
    let start = std::time::Instant::now();
    if !reviewer.health.listed() {
        reviewer.count("unknown", "unavailable");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "groundskeeper sysctl webhook: caches not listed yet\n",
        )
            .into_response();
    }
    let read = if body.len() > SMALL_BODY {
        // Parsing a large body takes milliseconds of CPU: off the async workers, so that the
        // bindings answered meanwhile do not wait behind it.
        match tokio::task::spawn_blocking(move || review::read(&body)).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, error = %e, "webhook: reading a request failed");
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "reading the request failed\n",
                )
                    .into_response();
            }
        }
    } else {
        review::read(&body)
    };
    let (allowed, subject) = match read {
        Ok(r) => r,
        Err(e) => {
            let e = ReviewError::from(e);
            tracing::warn!(target: LOG_TARGET, error = %e, "webhook: unreadable request");
            reviewer.count("unknown", "unreadable");
            reviewer.failed(&e);
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    let label = subject.label();
    let answer = reviewer.review(subject).await;
    reviewer
        .metrics
        .duration
        .with_label_values(&[label])
        .observe(start.elapsed().as_secs_f64());
    match answer {
        Ok((answer, outcome)) => {
            reviewer.count(label, outcome.label());
            (
                [(header::CONTENT_TYPE, "application/json")],
                review::respond(allowed, &answer),
            )
                .into_response()
        }
        Err(e) => {
            let e = ReviewError::ReadPod(e);
            tracing::warn!(target: LOG_TARGET, error = %e, "webhook: could not judge the request");
            reviewer.count(label, "error");
            reviewer.failed(&e);
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        }
    }
}

impl Reviewer {
    fn failed(&self, e: &ReviewError) {
        self.metrics
            .errors
            .with_label_values(&[e.metric_label()])
            .inc();
    }

    fn count(&self, subject: &str, result: &str) {
        self.metrics
            .reviews
            .with_label_values(&[subject, result])
            .inc();
    }

    /// The answer for `subject`; an error only when a binding's pod could not be read.
    async fn review(&self, subject: Subject) -> Result<(Answer, Outcome), kube::Error> {
        let (pod, pod_facts, node) = match subject {
            Subject::Other(what) => {
                tracing::debug!(target: LOG_TARGET, request = %what, "webhook: not judged, allowed");
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
                (name, PodFacts::of(&pod), node)
            }
            Subject::Binding {
                namespace,
                name,
                uid,
                node,
            } => {
                let key = ObjectKey::new(&namespace, &name);
                let cached = self.cache.lock().pending.get(&key).cloned();
                let pod = key.to_string();
                let pod_facts = match cached.filter(|v| uid.as_ref().is_none_or(|u| *u == v.uid)) {
                    Some(v) => v,
                    // Not seen by the watch yet (or another pod of the same name): read it,
                    // within the budget; past it, judge without the pod, failing safe.
                    None if !self.lookups.budget.try_take() => {
                        self.metrics
                            .refused
                            .with_label_values(&["lookup_budget"])
                            .inc();
                        let decision = {
                            let c = self.cache.lock();
                            let policies: Vec<&SysctlPolicy> = c.policies.values().collect();
                            decide_unread(&self.args, &pod, &node, c.nodes.get(&node), &policies)
                        };
                        let what = format!("pod {pod} onto node {node} (not read: over budget)");
                        return Ok(apply::answer(decision, self.dry_run, &what));
                    }
                    None => match Api::<Pod>::namespaced(self.lookups.client.clone(), &namespace)
                        .get_opt(&name)
                        .await?
                    {
                        Some(p) => PodFacts::of(&p),
                        // Gone: the binding fails on its own.
                        None => PodFacts::default(),
                    },
                };
                (pod, pod_facts, node)
            }
        };
        let decision = {
            let c = self.cache.lock();
            let policies: Vec<&SysctlPolicy> = c.policies.values().collect();
            decide(
                &self.args,
                &pod,
                &pod_facts,
                &node,
                c.nodes.get(&node),
                &policies,
            )
        };
        let what = format!("pod {pod} onto node {node}");
        Ok(apply::answer(decision, self.dry_run, &what))
    }
}

#[cfg(test)]
mod tests {
    use groundskeeper_sysctl_rules::crd::Mode;
    use serde_json::json;
    use testkit::api::Mock;

    use super::*;

    fn reviewer(mock: &Mock) -> Reviewer {
        Reviewer {
            args: PolicyArgs {
                allowed_unsafe_sysctls: vec![],
                sysctl_default_mode: Mode::Enforce,
            },
            dry_run: false,
            cache: Shared::default(),
            health: Health::new([]),
            lookups: Lookups {
                client: mock.client(),
                budget: Budget::new(0.0, 1),
            },
            metrics: Metrics::register(&prometheus::Registry::new()).unwrap(),
        }
    }

    /// A binding of a pod the cache has not seen: the webhook reads it from the apiserver.
    fn binding() -> Bytes {
        let req = json!({
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding",
            "operation": "CREATE", "userInfo": {"username": "system:kube-scheduler"},
            "namespace": "ns",
            "object": {"apiVersion": "v1", "kind": "Binding",
                       "metadata": {"name": "web-0"},
                       "target": {"kind": "Node", "name": "n1"}},
        });
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}))
            .unwrap()
            .into()
    }

    fn errors(j: &Reviewer) -> Vec<(&'static str, u64)> {
        ["unreadable"]
            .into_iter()
            .chain(groundskeeper_plumbing::client::API_ERROR_LABELS)
            .map(|l| (l, j.metrics.errors.with_label_values(&[l]).get()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// A binding of a pod not cached, with the lookup budget spent: answered without asking
    /// the apiserver, denied where the node could enforce (an unknown node under a default of
    /// Enforce), allowed where nothing could deny; counted as `lookup_budget`.
    #[tokio::test]
    async fn over_its_lookup_budget_a_binding_is_judged_without_its_pod() {
        for (mode, allowed) in [(Mode::Enforce, false), (Mode::Audit, true)] {
            let mock = Mock::answering(&[]);
            let mut j = reviewer(&mock);
            j.args.sysctl_default_mode = mode;
            j.lookups.budget = Budget::new(0.001, 1);
            assert!(j.lookups.budget.try_take(), "the one token, spent");
            let j = Arc::new(j);
            let r = handle(State(j.clone()), binding()).await;
            assert_eq!(r.status(), StatusCode::OK, "{mode:?}");
            let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
            let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(review["response"]["allowed"], allowed, "{mode:?}: {review}");
            assert!(mock.calls().is_empty(), "{mode:?}: {:?}", mock.calls());
            let refused = j
                .metrics
                .refused
                .with_label_values(&["lookup_budget"])
                .get();
            assert_eq!(refused, 1, "{mode:?}");
        }
        // Within the budget the pod is read (and the apiserver's failure is the answer's).
        let mock = Mock::answering(&[500]);
        let j = Arc::new(reviewer(&mock));
        let r = handle(State(j.clone()), binding()).await;
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(mock.calls().len(), 1, "{:?}", mock.calls());
    }

    #[tokio::test]
    async fn a_failed_review_is_counted_under_its_error() {
        for (code, want) in [
            (403, "forbidden"),
            (429, "too_many_requests"),
            (500, "server_error"),
        ] {
            let mock = Mock::answering(&[code]);
            let j = Arc::new(reviewer(&mock));
            let r = handle(State(j.clone()), binding()).await;
            assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "HTTP {code}");
            assert_eq!(errors(&j), [(want, 1)], "HTTP {code}");
        }
        let mock = Mock::answering(&[]);
        let j = Arc::new(reviewer(&mock));
        let r = handle(State(j.clone()), Bytes::from_static(b"{")).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(errors(&j), [("unreadable", 1)]);
        assert!(mock.calls().is_empty());
    }
}
