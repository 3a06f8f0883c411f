//! Who may read `/metrics`: anyone (`--metrics-auth=none`), or only callers the apiserver
//! authenticates and authorizes (`--metrics-auth=kubernetes`): the bearer token goes through a
//! TokenReview, its user through a SubjectAccessReview for `get` on the non-resource URL
//! `/metrics`, as kubelet and kube-rbac-proxy check theirs.
//!
//! Why: the node-agent serves on the host network, where a NetworkPolicy does not apply, so
//! any process that reaches a node's address could read what the metrics say about the node's
//! pods and services. `/healthz`, `/livez` and `/readyz` stay open: kubelet's probes carry no
//! token, and they reveal nothing.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{HeaderMap, StatusCode};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, api::PostParams};
use tokio::time::Instant;

/// `--metrics-auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsAuth {
    /// Anyone who reaches the port reads the metrics.
    None,
    /// Only a bearer token the apiserver authenticates, whose user may `get` `/metrics`.
    Kubernetes,
}

/// How long a verdict is reused, so that a scrape every few seconds makes no API call: an
/// allowed caller is checked again after this long, a refused one sooner.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Verdicts kept at most (tokens of scrapers: a handful); beyond it the cache starts over.
const CACHED_MAX: usize = 256;

/// A refusal: the status to answer and why.
pub type Refusal = (StatusCode, String);

/// Each token's verdict, and until when it holds.
type Verdicts = HashMap<String, (Instant, Result<(), Refusal>)>;

/// Checks callers of `/metrics` against the apiserver.
#[derive(Clone)]
pub struct Delegated {
    client: kube::Client,
    verdicts: Arc<Mutex<Verdicts>>,
}

impl Delegated {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            verdicts: Arc::default(),
        }
    }

    /// Ok if the request's bearer token belongs to a user allowed to `get` `/metrics`; else
    /// 401 (no token, or one the apiserver does not accept), 403 (not allowed), or 503 (the
    /// apiserver could not be asked: not cached, the next scrape asks again).
    pub async fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let Some(token) = bearer(headers) else {
            return Err((
                StatusCode::UNAUTHORIZED,
                "a bearer token is required (--metrics-auth=kubernetes)\n".into(),
            ));
        };
        let now = Instant::now();
        if let Some((until, verdict)) = self.lock().get(token)
            && *until > now
        {
            return verdict.clone();
        }
        let verdict = match self.review(token).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "could not check a /metrics caller with the apiserver");
                return Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    "could not check the token with the apiserver\n".into(),
                ));
            }
        };
        let keep = if verdict.is_ok() {
            ALLOWED_FOR
        } else {
            REFUSED_FOR
        };
        let mut verdicts = self.lock();
        if verdicts.len() >= CACHED_MAX {
            verdicts.clear();
        }
        verdicts.insert(token.to_string(), (now + keep, verdict.clone()));
        verdict
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Verdicts> {
        self.verdicts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The TokenReview, then the SubjectAccessReview of its user.
    async fn review(&self, token: &str) -> Result<Result<(), Refusal>, kube::Error> {
        let pp = PostParams::default();
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let status = Api::<TokenReview>::all(self.client.clone())
            .create(&pp, &review)
            .await?
            .status
            .unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => {
                return Ok(Err((
                    StatusCode::UNAUTHORIZED,
                    "the token was not accepted\n".into(),
                )));
            }
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let allowed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&pp, &access)
            .await?
            .status
            .is_some_and(|s| s.allowed);
        Ok(if allowed {
            Ok(())
        } else {
            tracing::info!(user = %name, "refused /metrics: not allowed to get it");
            Err((
                StatusCode::FORBIDDEN,
                format!("{name} may not get /metrics\n"),
            ))
        })
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}
