//! Who may read `/metrics`: anyone (`--metrics-auth=none`), or only callers the apiserver
//! authenticates and authorizes (`--metrics-auth=kubernetes`): the bearer token goes through a
//! TokenReview, its user through a SubjectAccessReview for `get` on the non-resource URL
//! `/metrics`, as kubelet and kube-rbac-proxy check theirs.
//!
//! Why: the node-agent serves on the host network, where a NetworkPolicy does not apply, so
//! any process that reaches a node's address could read what the metrics say about the node's
//! pods and services. `/healthz`, `/livez` and `/readyz` stay open: kubelet's probes carry no
//! token, and they reveal nothing.
//!
//! What a caller without credentials can cost: a token not shaped as a JWT is refused without
//! an API call; so is a token that claims the ServiceAccount issuer and is not signed by one of
//! its keys, or has expired (`jwks.rs`, with the keys `keys.rs` reads from the apiserver).
//! Checks of tokens not seen allowed before are held to small budgets (past them: 429, not
//! asked): one for tokens the issuer's keys signed, which made-up tokens can not spend, one for
//! the others (other issuers, or any token while the keys can not be read); renewals of
//! scrapers' answers have a third. Answers are cached, refusals briefly, allowed and refused in
//! two least-recently-used maps of bounded size.
//!
//! During an apiserver outage (unreachable, or answering 5xx) a caller allowed before keeps being
//! served for up to an hour after its answer ran out (`groundskeeper_metrics_auth_unchecked_total`
//! counts it); not when the apiserver answers the review with a refusal (403, 429). A token never
//! seen gets 503.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{HeaderMap, StatusCode};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, api::PostParams};
use prometheus::{IntCounter, IntCounterVec, Opts};
use tokio::time::Instant;

use crate::{client::ratelimit::Budget, lru::Lru};

pub mod jwks;
pub mod keys;

use jwks::{Jwt, TokenCheck};
use keys::IssuerKeys;

/// `--metrics-auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsAuth {
    /// Anyone who reaches the port reads the metrics.
    None,
    /// Only a bearer token the apiserver authenticates, whose user may `get` `/metrics`.
    Kubernetes,
}

/// How long an answer is reused, so that a scrape every few seconds makes no API call: an
/// allowed caller is checked again after this long, a refused one sooner.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// How long after its answer ran out a caller allowed before is still served when it can not
/// be checked again (the apiserver is down, or the renewal budget is spent): scrapers keep
/// their metrics through an outage, which is when they matter most. Bounded, so that a token
/// revoked during a long outage is not served for ever; a projected ServiceAccount token is
/// replaced by kubelet within the hour anyway, and a token never seen can not be checked.
const UNCHECKED_FOR: Duration = Duration::from_secs(3600);
/// Answers kept at most, allowed and refused apart, each evicting its least recently used:
/// made-up tokens fill only the refusals and never push a scraper's answer out.
const CACHED_MAX: usize = 256;
/// The longest token sent to the apiserver: ServiceAccount tokens are about 1 KiB, an OIDC
/// token with many groups a few.
const TOKEN_MAX: usize = 8192;
/// Checks (a TokenReview, then a SubjectAccessReview when the token is accepted) of tokens not
/// allowed before: what any caller of the port can make this process ask the apiserver.
const FRESH_QPS: f32 = 1.0;
const FRESH_BURST: u32 = 10;
/// Checks of tokens not allowed before that the ServiceAccount issuer's keys signed: a new
/// scraper (a Prometheus restarted with a new projected token) is checked on a budget that
/// made-up tokens can not spend.
const SIGNED_QPS: f32 = 1.0;
const SIGNED_BURST: u32 = 10;
/// Checks of tokens allowed before whose answer ran out: a scraper is checked again on a budget
/// that made-up tokens can not spend.
const RENEWAL_QPS: f32 = 1.0;
const RENEWAL_BURST: u32 = 5;

/// A refusal: the status to answer and why.
pub type Refusal = (StatusCode, String);

struct TokenAnswers {
    /// Until when each allowed token's answer holds; kept after that (until evicted) to
    /// know the token for the renewal budget.
    allowed: Lru<String, Instant>,
    refused: Lru<String, (Instant, Refused)>,
}

/// Checks callers of `/metrics` against the apiserver.
#[derive(Clone)]
pub struct Delegated {
    client: kube::Client,
    answers: Arc<Mutex<TokenAnswers>>,
    keys: IssuerKeys,
    fresh: Budget,
    signed: Budget,
    renewals: Budget,
    refused: IntCounterVec,
    unchecked: IntCounter,
}

/// Every value of the `reason` label of `groundskeeper_metrics_auth_refused_total`.
pub const REFUSED_REASONS: [&str; 10] = [
    "no_token",
    "malformed",
    "bad_signature",
    "unknown_key",
    "expired",
    "not_yet_valid",
    "over_budget",
    "unauthenticated",
    "forbidden",
    "unavailable",
];

/// A refusal and its `reason` label.
type Refused = (Refusal, &'static str);

impl Delegated {
    /// Checks with `client`, which should be a client of its own (`KubeArgs::own_client`): the
    /// checks callers cause must not wait behind, or spend, the budget the watches share.
    pub fn new(client: kube::Client, registry: &prometheus::Registry) -> prometheus::Result<Self> {
        let refused = crate::metrics::registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_metrics_auth_refused_total",
                    "Requests for /metrics refused (--metrics-auth=kubernetes), by reason: no_token, malformed \
                     (not a JWT: not sent to the apiserver); bad_signature, unknown_key, expired, not_yet_valid \
                     (a token of the ServiceAccount issuer its keys refuse: not sent); over_budget (too many \
                     tokens to check: 429), unauthenticated (401), forbidden (403), unavailable (the apiserver \
                     could not be asked: 503).",
                ),
                &["reason"],
            ),
        )?;
        for r in REFUSED_REASONS {
            refused.with_label_values(&[r]);
        }
        let unchecked = crate::metrics::registered(
            registry,
            IntCounter::new(
                "groundskeeper_metrics_auth_unchecked_total",
                "Requests for /metrics served to a caller allowed before whose verdict had run out, because it \
                 could not be checked again (the apiserver could not be asked, or the budget of renewals was spent); \
                 at most an hour after the verdict ran out.",
            ),
        )?;
        Ok(Self {
            keys: IssuerKeys::new(client.clone()),
            client,
            answers: Arc::new(Mutex::new(TokenAnswers {
                allowed: Lru::new(CACHED_MAX),
                refused: Lru::new(CACHED_MAX),
            })),
            fresh: Budget::new(FRESH_QPS, FRESH_BURST),
            signed: Budget::new(SIGNED_QPS, SIGNED_BURST),
            renewals: Budget::new(RENEWAL_QPS, RENEWAL_BURST),
            refused,
            unchecked,
        })
    }

    /// Ok if the request's bearer token belongs to a user allowed to `get` `/metrics`; else
    /// 401 (no token, one not shaped as a JWT, one of the ServiceAccount issuer its keys refuse,
    /// or one the apiserver does not accept), 403 (not allowed), 429 (more new tokens than the
    /// budget of checks allows: not asked), or 503 (the apiserver could not be asked: not
    /// cached, the next scrape asks again).
    pub async fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        self.authorize(headers).await.map_err(|(refusal, reason)| {
            self.refused.with_label_values(&[reason]).inc();
            refusal
        })
    }

    async fn authorize(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let Some(token) = bearer(headers) else {
            return Err((
                (
                    StatusCode::UNAUTHORIZED,
                    "a bearer token is required (--metrics-auth=kubernetes)\n".into(),
                ),
                "no_token",
            ));
        };
        let jwt = match jwt_shaped(token).then(|| Jwt::parse(token)) {
            Some(Ok(jwt)) => jwt,
            why => {
                let why = match why {
                    Some(Err(jwks::Malformed(why))) => why,
                    _ => "not three base64url segments",
                };
                return Err((
                    (
                        StatusCode::UNAUTHORIZED,
                        format!("the bearer token is not a JWT (a ServiceAccount token): {why}\n"),
                    ),
                    "malformed",
                ));
            }
        };
        let now = Instant::now();
        // Until when a caller allowed before whose answer ran out may still be served unchecked.
        let known = {
            let mut guard = self.lock();
            let v = &mut *guard;
            match v.allowed.get(token) {
                Some(until) if *until > now => return Ok(()),
                Some(until) => Some(*until + UNCHECKED_FOR),
                None => {
                    if let Some((until, refused)) = v.refused.get(token)
                        && *until > now
                    {
                        return Err(refused.clone());
                    }
                    None
                }
            }
        };
        let unchecked = || {
            let serve = known.is_some_and(|until| now < until);
            if serve {
                self.unchecked.inc();
            }
            serve
        };
        // A scraper allowed before is checked again by the apiserver alone, on its own budget:
        // the keys are for tokens never seen.
        let budget = match known {
            Some(_) => &self.renewals,
            None => match self.check_token(&jwt).await {
                TokenCheck::Signed => &self.signed,
                TokenCheck::Refused(flaw) => {
                    return Err((
                        (StatusCode::UNAUTHORIZED, flaw.message().into()),
                        flaw.reason(),
                    ));
                }
                TokenCheck::Foreign | TokenCheck::Unchecked | TokenCheck::UnknownKey => &self.fresh,
            },
        };
        if !budget.try_take() {
            if unchecked() {
                return Ok(());
            }
            tracing::debug!(
                renewal = known.is_some(),
                "/metrics: over the budget of token checks, not asked"
            );
            return Err((
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many tokens to check with the apiserver; retry later\n".into(),
                ),
                "over_budget",
            ));
        }
        let answer = match self.review(token).await {
            Ok(v) => v,
            Err(e) => {
                // The grace is for an apiserver that could not be asked (unreachable, 5xx), not
                // one that answered: a 403 or 429 is its word on the check.
                let answered = matches!(&e, kube::Error::Api(s) if s.code < 500);
                if !answered && unchecked() {
                    tracing::info!(error = %e, "could not check a /metrics caller with the apiserver; served it, as it was allowed before");
                    return Ok(());
                }
                tracing::warn!(error = %e, "could not check a /metrics caller with the apiserver");
                return Err((
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "could not check the token with the apiserver\n".into(),
                    ),
                    "unavailable",
                ));
            }
        };
        let mut v = self.lock();
        match &answer {
            Ok(()) => {
                v.refused.remove(token);
                v.allowed.put(token.to_string(), now + ALLOWED_FOR);
            }
            Err(refusal) => {
                v.allowed.remove(token);
                v.refused
                    .put(token.to_string(), (now + REFUSED_FOR, refusal.clone()));
            }
        }
        answer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TokenAnswers> {
        self.answers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the issuer's keys say of a token not seen allowed before. Keys not read (yet) judge
    /// nothing: every token is then left to the apiserver, as without them. A token naming a key
    /// not held has the keys read again (at most once per [`keys::FETCH_EVERY`]) before it is
    /// refused.
    async fn check_token(&self, jwt: &Jwt<'_>) -> TokenCheck {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let held = self.keys.current().await;
        let Some(keys) = &held.keys else {
            return TokenCheck::Foreign;
        };
        if jwt.issuer() != Some(keys.issuer.as_str()) {
            return TokenCheck::Foreign;
        }
        match jwks::check(jwt, keys, now) {
            TokenCheck::UnknownKey => match &self.keys.refresh(&held).await.keys {
                Some(keys) => match jwks::check(jwt, keys, now) {
                    TokenCheck::UnknownKey => TokenCheck::Refused(jwks::Flaw::UnknownKey),
                    judged => judged,
                },
                None => TokenCheck::Foreign,
            },
            judged => judged,
        }
    }

    /// The TokenReview, then the SubjectAccessReview of its user.
    async fn review(&self, token: &str) -> Result<Result<(), Refused>, kube::Error> {
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
                    (
                        StatusCode::UNAUTHORIZED,
                        "the token was not accepted\n".into(),
                    ),
                    "unauthenticated",
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
                (
                    StatusCode::FORBIDDEN,
                    format!("{name} may not get /metrics\n"),
                ),
                "forbidden",
            ))
        })
    }
}

/// Shaped as a JWT (what ServiceAccount and OIDC tokens are): three non-empty base64url
/// segments, at most `TOKEN_MAX` long. Anything else is refused without asking the apiserver,
/// so a caller sending junk costs it nothing. (Static and bootstrap tokens are not JWTs: they
/// can not read `/metrics`.)
pub fn jwt_shaped(token: &str) -> bool {
    let b64url = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    token.len() <= TOKEN_MAX && {
        let parts: Vec<&str> = token.split('.').collect();
        parts.len() == 3 && parts.iter().all(|p| b64url(p))
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod delegated_tests;
#[cfg(test)]
mod jwks_tests;
#[cfg(test)]
mod keys_tests;
