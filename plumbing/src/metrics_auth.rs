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
//! an API call; checks of tokens not seen allowed before are held to a small budget (past it:
//! 429, not asked), apart from the renewals of scrapers' verdicts; verdicts are cached, refusals
//! briefly, allowed and refused in two least-recently-used maps of bounded size.
//!
//! During an apiserver outage (unreachable, or answering 5xx) a caller allowed before keeps being
//! served for up to an hour after its verdict ran out (`groundskeeper_metrics_auth_unchecked_total`
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

use crate::{lru::Lru, ratelimit::Budget};

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
/// How long after its verdict ran out a caller allowed before is still served when it can not
/// be checked again (the apiserver is down, or the renewal budget is spent): scrapers keep
/// their metrics through an outage, which is when they matter most. Bounded, so that a token
/// revoked during a long outage is not served for ever; a projected ServiceAccount token is
/// replaced by kubelet within the hour anyway, and a token never seen can not be checked.
const UNCHECKED_FOR: Duration = Duration::from_secs(3600);
/// Verdicts kept at most, allowed and refused apart, each evicting its least recently used:
/// made-up tokens fill only the refusals and never push a scraper's verdict out.
const CACHED_MAX: usize = 256;
/// The longest token sent to the apiserver: ServiceAccount tokens are about 1 KiB, an OIDC
/// token with many groups a few.
const TOKEN_MAX: usize = 8192;
/// Checks (a TokenReview, then a SubjectAccessReview when the token is accepted) of tokens not
/// allowed before: what any caller of the port can make this process ask the apiserver.
const FRESH_QPS: f32 = 1.0;
const FRESH_BURST: u32 = 10;
/// Checks of tokens allowed before whose verdict ran out: a scraper is checked again on a budget
/// that made-up tokens can not spend.
const RENEWAL_QPS: f32 = 1.0;
const RENEWAL_BURST: u32 = 5;

/// A refusal: the status to answer and why.
pub type Refusal = (StatusCode, String);

struct Verdicts {
    /// Until when each allowed token's verdict holds; kept after that (until evicted) to
    /// know the token for the renewal budget.
    allowed: Lru<String, Instant>,
    refused: Lru<String, (Instant, Refusal)>,
}

/// Checks callers of `/metrics` against the apiserver.
#[derive(Clone)]
pub struct Delegated {
    client: kube::Client,
    verdicts: Arc<Mutex<Verdicts>>,
    fresh: Budget,
    renewals: Budget,
    refused: IntCounterVec,
    unchecked: IntCounter,
}

/// Every value of the `reason` label of `groundskeeper_metrics_auth_refused_total`.
pub const REFUSED_REASONS: [&str; 6] = [
    "no_token",
    "malformed",
    "over_budget",
    "unauthenticated",
    "forbidden",
    "unavailable",
];

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
                     (not a JWT: not sent to the apiserver), over_budget (too many tokens to check: 429), \
                     unauthenticated (401), forbidden (403), unavailable (the apiserver could not be asked: 503).",
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
            client,
            verdicts: Arc::new(Mutex::new(Verdicts {
                allowed: Lru::new(CACHED_MAX),
                refused: Lru::new(CACHED_MAX),
            })),
            fresh: Budget::new(FRESH_QPS, FRESH_BURST),
            renewals: Budget::new(RENEWAL_QPS, RENEWAL_BURST),
            refused,
            unchecked,
        })
    }

    /// Ok if the request's bearer token belongs to a user allowed to `get` `/metrics`; else
    /// 401 (no token, one not shaped as a JWT, or one the apiserver does not accept), 403 (not
    /// allowed), 429 (more new tokens than the budget of checks allows: not asked), or 503 (the
    /// apiserver could not be asked: not cached, the next scrape asks again).
    pub async fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let verdict = self.verdict(headers).await;
        if let Err((status, _)) = &verdict {
            let reason = match *status {
                StatusCode::FORBIDDEN => "forbidden",
                StatusCode::TOO_MANY_REQUESTS => "over_budget",
                StatusCode::SERVICE_UNAVAILABLE => "unavailable",
                _ => match bearer(headers) {
                    None => "no_token",
                    Some(t) if !jwt_shaped(t) => "malformed",
                    Some(_) => "unauthenticated",
                },
            };
            self.refused.with_label_values(&[reason]).inc();
        }
        verdict
    }

    async fn verdict(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let Some(token) = bearer(headers) else {
            return Err((
                StatusCode::UNAUTHORIZED,
                "a bearer token is required (--metrics-auth=kubernetes)\n".into(),
            ));
        };
        if !jwt_shaped(token) {
            return Err((
                StatusCode::UNAUTHORIZED,
                "the bearer token is not a JWT (a ServiceAccount token)\n".into(),
            ));
        }
        let now = Instant::now();
        // Until when a caller allowed before whose verdict ran out may still be served unchecked.
        let known = {
            let mut guard = self.lock();
            let v = &mut *guard;
            match v.allowed.get(token) {
                Some(until) if *until > now => return Ok(()),
                Some(until) => Some(*until + UNCHECKED_FOR),
                None => {
                    if let Some((until, refusal)) = v.refused.get(token)
                        && *until > now
                    {
                        return Err(refusal.clone());
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
        let budget = if known.is_some() {
            &self.renewals
        } else {
            &self.fresh
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
                StatusCode::TOO_MANY_REQUESTS,
                "too many tokens to check with the apiserver; retry later\n".into(),
            ));
        }
        let verdict = match self.review(token).await {
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
                    StatusCode::SERVICE_UNAVAILABLE,
                    "could not check the token with the apiserver\n".into(),
                ));
            }
        };
        let mut v = self.lock();
        match &verdict {
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

/// Shaped as a JWT (what ServiceAccount and OIDC tokens are): three non-empty base64url
/// segments, at most [`TOKEN_MAX`] long. Anything else is refused without asking the apiserver,
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
mod tests {
    use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

    use super::*;

    const HEADER: &str = "eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ";

    fn jwt(payload: &str) -> String {
        format!("{HEADER}.{payload}.c2lnbmF0dXJl")
    }

    #[test]
    fn only_jwt_shaped_tokens_are_sent() {
        let long = format!("{HEADER}.{}.sig", "a".repeat(TOKEN_MAX));
        for (token, want) in [
            (jwt("cGF5bG9hZA").as_str(), true),
            ("a.b.c", true),
            ("a-_9.B.c_", true),
            ("abcdef.0123456789abcdef", false), // a bootstrap token
            ("not-a-token", false),
            ("a.b.c.d", false),
            ("a..c", false),
            (".b.c", false),
            ("a.b.", false),
            ("a.b=.c", false),
            ("a.b+/.c", false),
            ("a.b c.d", false),
            ("a.b.ç", false),
            (long.as_str(), false),
        ] {
            assert_eq!(jwt_shaped(token), want, "{token:.40}");
        }
    }

    /// An apiserver that accepts `jwt("reader")` (allowed to get /metrics) and no other token,
    /// counting the TokenReviews it answers.
    fn apiserver(reviews: Arc<AtomicUsize>) -> kube::Client {
        flaky_apiserver(reviews, Arc::default())
    }

    /// [`apiserver`], answering 503 to everything while `down` is set.
    /// An apiserver answering reviews, or, while `down` holds a status code, that code.
    fn flaky_apiserver(reviews: Arc<AtomicUsize>, down: Arc<AtomicU16>) -> kube::Client {
        use kube::client::Body;
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let (reviews, down) = (reviews.clone(), down.clone());
            async move {
                let code = down.load(Ordering::SeqCst);
                if code != 0 {
                    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "reason": "Unavailable", "code": code});
                    return Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .status(code)
                            .body(Body::from(status.to_string().into_bytes()))
                            .unwrap(),
                    );
                }
                let path = req.uri().path().to_string();
                let body: serde_json::Value =
                    serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap())
                        .unwrap();
                let mut r = body.clone();
                if path.ends_with("/tokenreviews") {
                    reviews.fetch_add(1, Ordering::SeqCst);
                    r["status"] = if body["spec"]["token"] == jwt("reader") {
                        serde_json::json!({"authenticated": true, "user": {"username": "reader"}})
                    } else {
                        serde_json::json!({"authenticated": false})
                    };
                } else {
                    r["status"] = serde_json::json!({"allowed": true});
                }
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(201)
                        .body(Body::from(r.to_string().into_bytes()))
                        .unwrap(),
                )
            }
        });
        kube::Client::new(service, "default")
    }

    fn headers(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        h
    }

    /// A flood of made-up tokens, each new: the apiserver is asked within the budget only, the
    /// rest answered 429 unasked; junk is never sent; the scraper's verdict survives the flood
    /// in the cache, and once it runs out it is renewed on its own budget mid-flood.
    #[tokio::test(start_paused = true)]
    async fn made_up_tokens_cost_the_budget_and_no_scraper_its_verdict() {
        let reviews = Arc::new(AtomicUsize::new(0));
        let auth =
            Delegated::new(apiserver(reviews.clone()), &prometheus::Registry::new()).unwrap();
        let reader = headers(&jwt("reader"));
        assert_eq!(auth.check(&reader).await, Ok(()));
        assert_eq!(reviews.load(Ordering::SeqCst), 1);

        let flood = |from: usize| {
            let auth = auth.clone();
            async move {
                let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
                for i in from..from + 2000 {
                    let token = jwt(&format!("Ym9ndXM{i}"));
                    let status = auth.check(&headers(&token)).await.unwrap_err().0;
                    *statuses.entry(status.as_u16()).or_default() += 1;
                }
                statuses
            }
        };
        let statuses = flood(0).await;
        let asked = reviews.load(Ordering::SeqCst) - 1;
        // The reader's first check took one of the burst.
        assert_eq!(asked, FRESH_BURST as usize - 1, "{statuses:?}");
        assert_eq!(statuses.get(&401), Some(&asked), "{statuses:?}");
        assert_eq!(statuses.get(&429), Some(&(2000 - asked)), "{statuses:?}");
        for junk in ["junk", "a.b", "a.b.c.d"] {
            assert_eq!(
                auth.check(&headers(junk)).await.unwrap_err().0,
                StatusCode::UNAUTHORIZED
            );
        }
        assert_eq!(
            reviews.load(Ordering::SeqCst),
            1 + asked,
            "junk is not sent"
        );
        assert_eq!(
            auth.check(&reader).await,
            Ok(()),
            "cached through the flood"
        );
        assert_eq!(reviews.load(Ordering::SeqCst), 1 + asked);
        // A refusal is remembered: the same made-up token again costs nothing.
        let bogus = headers(&jwt("Ym9ndXM0"));
        assert_eq!(
            auth.check(&bogus).await.unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(reviews.load(Ordering::SeqCst), 1 + asked);

        // The reader's verdict runs out while the flood goes on: it is checked again.
        tokio::time::advance(ALLOWED_FOR + Duration::from_secs(1)).await;
        flood(10_000).await;
        let before = reviews.load(Ordering::SeqCst);
        assert_eq!(auth.check(&reader).await, Ok(()), "renewed mid-flood");
        assert_eq!(reviews.load(Ordering::SeqCst), before + 1);
        let refused = |r: &str| auth.refused.with_label_values(&[r]).get();
        assert_eq!(refused("malformed"), 3);
        assert!(refused("over_budget") >= 2000 - FRESH_BURST as u64);
    }

    /// Through an apiserver outage, a scraper allowed before keeps its metrics (for up to
    /// UNCHECKED_FOR after its verdict ran out), while a token never seen, or refused before,
    /// is not served; once the apiserver is back the scraper is checked again.
    #[tokio::test(start_paused = true)]
    async fn an_allowed_scraper_is_served_through_an_outage_and_no_one_else() {
        let (reviews, down) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU16::new(0)));
        let auth = Delegated::new(
            flaky_apiserver(reviews.clone(), down.clone()),
            &prometheus::Registry::new(),
        )
        .unwrap();
        let reader = headers(&jwt("reader"));
        let bogus = headers(&jwt("Ym9ndXM"));
        assert_eq!(auth.check(&reader).await, Ok(()));
        assert_eq!(
            auth.check(&bogus).await.unwrap_err().0,
            StatusCode::UNAUTHORIZED
        );

        down.store(503, Ordering::SeqCst);
        tokio::time::advance(ALLOWED_FOR + Duration::from_secs(1)).await;
        for _ in 0..3 {
            assert_eq!(auth.check(&reader).await, Ok(()), "allowed before: served");
        }
        assert_eq!(auth.unchecked.get(), 3);
        let new = headers(&jwt("bmV3"));
        assert_eq!(
            auth.check(&new).await.unwrap_err().0,
            StatusCode::SERVICE_UNAVAILABLE,
            "never seen: not served"
        );
        assert_eq!(
            auth.check(&bogus).await.unwrap_err().0,
            StatusCode::SERVICE_UNAVAILABLE,
            "refused before: not served"
        );

        tokio::time::advance(UNCHECKED_FOR).await;
        assert_eq!(
            auth.check(&reader).await.unwrap_err().0,
            StatusCode::SERVICE_UNAVAILABLE,
            "not for ever"
        );
        assert_eq!(auth.unchecked.get(), 3);

        down.store(0, Ordering::SeqCst);
        let before = reviews.load(Ordering::SeqCst);
        assert_eq!(auth.check(&reader).await, Ok(()));
        assert_eq!(reviews.load(Ordering::SeqCst), before + 1, "checked again");
    }

    /// The grace is for an apiserver that can not be reached or fails: one that answers and
    /// refuses the review (403: the checks are no longer allowed; 429: it sheds load) is an
    /// answer, and a caller whose verdict ran out is then not served unchecked.
    #[tokio::test(start_paused = true)]
    async fn no_grace_when_the_apiserver_answers_and_refuses_the_review() {
        for code in [403u16, 429] {
            let down = Arc::new(AtomicU16::new(0));
            let auth = Delegated::new(
                flaky_apiserver(Arc::new(AtomicUsize::new(0)), down.clone()),
                &prometheus::Registry::new(),
            )
            .unwrap();
            let reader = headers(&jwt("reader"));
            assert_eq!(auth.check(&reader).await, Ok(()));
            down.store(code, Ordering::SeqCst);
            tokio::time::advance(ALLOWED_FOR + Duration::from_secs(1)).await;
            assert_eq!(
                auth.check(&reader).await.unwrap_err().0,
                StatusCode::SERVICE_UNAVAILABLE,
                "{code}: served unchecked"
            );
            assert_eq!(auth.unchecked.get(), 0, "{code}");
        }
    }
}
