//! `Delegated` against a scripted apiserver: floods, outages, renewals.

use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

use super::jwks_tests::{ISSUER, Signer, b64, forged};
use super::*;

const HEADER: &str = "eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ";

/// A JWT of no issuer for `sub`, with a made-up signature: a token of another authenticator as
/// far as the keys can tell, left to the apiserver.
pub fn jwt(sub: &str) -> String {
    let payload = serde_json::json!({ "sub": sub }).to_string();
    format!(
        "{HEADER}.{}.c2lnbmF0dXJl",
        super::jwks_tests::b64(payload.as_bytes())
    )
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
/// counting the TokenReviews it answers; issuer discovery is not served.
fn apiserver(reviews: Arc<AtomicUsize>) -> kube::Client {
    flaky_apiserver(reviews, Arc::default())
}

/// [`apiserver`], answering every request with the status code `down` holds while it is not 0.
fn flaky_apiserver(reviews: Arc<AtomicUsize>, down: Arc<AtomicU16>) -> kube::Client {
    let api = Arc::new(Apiserver {
        reviews,
        down,
        ..Default::default()
    });
    api.client()
}

/// The scripted apiserver: what it answers, and what it was asked.
#[derive(Default)]
pub struct Apiserver {
    /// TokenReviews answered.
    pub reviews: Arc<AtomicUsize>,
    /// Reads of the keys asked for (the discovery document, read first), answered or not.
    pub reads: AtomicUsize,
    /// While not 0, the status every request is answered with.
    pub down: Arc<AtomicU16>,
    /// The keys published; `None`: issuer discovery is not served (404).
    pub keys: Mutex<Option<Vec<serde_json::Value>>>,
    /// The tokens it accepts beside `jwt("reader")`, all allowed to get /metrics.
    pub accepted: Mutex<Vec<String>>,
}

impl Apiserver {
    pub fn client(self: &Arc<Self>) -> kube::Client {
        use kube::client::Body;
        let api = self.clone();
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let api = api.clone();
            async move {
                let answer = |code: u16, body: Vec<u8>| {
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .status(code)
                            .body(Body::from(body))
                            .unwrap(),
                    )
                };
                let path = req.uri().path().to_string();
                if path == "/.well-known/openid-configuration" {
                    api.reads.fetch_add(1, Ordering::SeqCst);
                }
                let code = api.down.load(Ordering::SeqCst);
                if code != 0 {
                    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "reason": "Unavailable", "code": code});
                    return answer(code, status.to_string().into_bytes());
                }
                if req.method() == http::Method::GET {
                    let keys = api.keys.lock().unwrap().clone();
                    let (discovery, jwks) = super::jwks_tests::documents(&keys.unwrap_or_default());
                    return match (api.keys.lock().unwrap().is_some(), path.as_str()) {
                        (true, "/.well-known/openid-configuration") => answer(200, discovery),
                        (true, "/openid/v1/jwks") => answer(200, jwks),
                        _ => answer(404, b"{}".to_vec()),
                    };
                }
                let body: serde_json::Value =
                    serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap())
                        .unwrap();
                let mut r = body.clone();
                if path.ends_with("/tokenreviews") {
                    api.reviews.fetch_add(1, Ordering::SeqCst);
                    let token = body["spec"]["token"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    r["status"] = if token == jwt("reader")
                        || api.accepted.lock().unwrap().contains(&token)
                    {
                        serde_json::json!({"authenticated": true, "user": {"username": "reader"}})
                    } else {
                        serde_json::json!({"authenticated": false})
                    };
                } else {
                    r["status"] = serde_json::json!({"allowed": true});
                }
                answer(201, r.to_string().into_bytes())
            }
        });
        kube::Client::new(service, "default")
    }
}

pub fn headers(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        http::header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    h
}

/// A flood of made-up tokens, each new: the apiserver is asked within the budget only, the
/// rest answered 429 unasked; junk is never sent; the scraper's answer survives the flood
/// in the cache, and once it runs out it is renewed on its own budget mid-flood.
#[tokio::test(start_paused = true)]
async fn made_up_tokens_cost_the_budget_and_no_scraper_its_answer() {
    let reviews = Arc::new(AtomicUsize::new(0));
    let auth = Delegated::new(apiserver(reviews.clone()), &prometheus::Registry::new()).unwrap();
    let reader = headers(&jwt("reader"));
    assert_eq!(auth.check(&reader).await, Ok(()));
    assert_eq!(reviews.load(Ordering::SeqCst), 1);

    let flood = |from: usize| {
        let auth = auth.clone();
        async move {
            let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
            for i in from..from + 2000 {
                let token = jwt(&format!("bogus{i}"));
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
    let bogus = headers(&jwt("bogus0"));
    assert_eq!(
        auth.check(&bogus).await.unwrap_err().0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(reviews.load(Ordering::SeqCst), 1 + asked);

    // The reader's answer runs out while the flood goes on: it is checked again.
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
/// UNCHECKED_FOR after its answer ran out), while a token never seen, or refused before,
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
    let bogus = headers(&jwt("bogus"));
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
    let new = headers(&jwt("new"));
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
/// answer, and a caller whose answer ran out is then not served unchecked.
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

/// Seconds since the Unix epoch, as `Delegated` judges tokens by.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// An apiserver publishing `signer`'s key, and a `Delegated` asking it.
pub fn with_keys(signer: &Signer) -> (Arc<Apiserver>, Delegated) {
    let api = Arc::new(Apiserver::default());
    *api.keys.lock().unwrap() = Some(vec![signer.jwk()]);
    let auth = Delegated::new(api.client(), &prometheus::Registry::new()).unwrap();
    (api, auth)
}

/// Made-up tokens claiming the ServiceAccount issuer, the `i`th of each kind: a real token
/// with its signature changed, one signed by another key under the issuer's key id, `alg:
/// none`, one naming a key the issuer does not publish, one naming no key.
fn forgeries(real: &str, attacker: &Signer, i: usize) -> [String; 5] {
    let claims = serde_json::json!({"iss": ISSUER, "sub": format!("system:serviceaccount:x:flood-{i}"),
        "exp": unix_now() + 3600.0});
    let b = |v: serde_json::Value| b64(v.to_string().as_bytes());
    [
        forged(real),
        attacker.sign(
            serde_json::json!({"alg": "ES256", "kid": "sa-key"}),
            claims.clone(),
        ),
        format!(
            "{}.{}.c2lnbmF0dXJl",
            b(serde_json::json!({"alg": "none", "kid": "sa-key"})),
            b(claims.clone())
        ),
        attacker.sign(
            serde_json::json!({"alg": "ES256", "kid": format!("made-up-{i}")}),
            claims.clone(),
        ),
        attacker.sign(serde_json::json!({"alg": "ES256"}), claims),
    ]
}

/// 10,000 made-up tokens claiming the ServiceAccount issuer, and 2,000 of no issuer, all new:
/// a NEW scraper (its token signed by the issuer's key, never seen) is served in the middle of
/// the flood, not refused 429; the forgeries cost no TokenReview and no read of the keys
/// beyond the first (the made-up key ids are within its interval), while those of no issuer spend only their own budget.
#[tokio::test(start_paused = true)]
async fn a_new_scraper_is_served_during_a_flood_of_forged_tokens() {
    let (issuer, attacker) = (Signer::new("sa-key"), Signer::new("sa-key"));
    let (api, auth) = with_keys(&issuer);
    let known = issuer.token("system:serviceaccount:x:known", unix_now());
    let new = issuer.token("system:serviceaccount:monitoring:prometheus", unix_now());
    api.accepted.lock().unwrap().push(new.clone());

    let mut statuses = std::collections::BTreeMap::<(u16, &str), usize>::new();
    let mut reasons = |r: Result<(), Refusal>, what| {
        *statuses
            .entry((r.unwrap_err().0.as_u16(), what))
            .or_default() += 1;
    };
    for i in 0..2000 {
        for (n, token) in forgeries(&known, &attacker, i).into_iter().enumerate() {
            reasons(
                auth.check(&headers(&token)).await,
                ["forged", "other key", "none", "unknown kid", "no kid"][n],
            );
        }
        reasons(
            auth.check(&headers(&jwt(&format!("bogus{i}")))).await,
            "no issuer",
        );
        if i == 1000 {
            assert_eq!(
                api.reviews.load(Ordering::SeqCst),
                FRESH_BURST as usize,
                "no issuer: the fresh budget"
            );
            assert_eq!(
                auth.check(&headers(&new)).await,
                Ok(()),
                "the new scraper, mid-flood"
            );
            assert_eq!(
                auth.check(&headers(&new)).await,
                Ok(()),
                "and its answer kept"
            );
        }
    }
    let reviews = api.reviews.load(Ordering::SeqCst);
    assert_eq!(
        reviews,
        FRESH_BURST as usize + 1,
        "forgeries sent to the apiserver: {statuses:?}"
    );
    assert_eq!(
        api.reads.load(Ordering::SeqCst),
        1,
        "the keys read once: made-up key ids read them again at most once per interval"
    );
    for what in ["forged", "other key", "none", "unknown kid", "no kid"] {
        assert_eq!(
            statuses.get(&(401, what)),
            Some(&2000),
            "{what}: {statuses:?}"
        );
    }
    let refused = |r: &str| auth.refused.with_label_values(&[r]).get();
    assert_eq!(refused("bad_signature"), 6000);
    assert_eq!(refused("unknown_key"), 4000);
    assert_eq!(refused("over_budget"), 2000 - FRESH_BURST as u64);
    assert_eq!(refused("unauthenticated"), FRESH_BURST as u64);
}

/// Made-up tokens of every shape (random segments, JSON of the wrong types, headers and
/// payloads claiming the issuer with random signatures and key ids) are refused 401 and never
/// sent to the apiserver.
#[tokio::test(start_paused = true)]
async fn junk_never_reaches_the_apiserver() {
    let issuer = Signer::new("sa-key");
    let (api, auth) = with_keys(&issuer);
    let seed = 0x6a75_6e6b;
    let mut rng = testkit::rng::Rng(seed);
    let b = |v: &[u8]| b64(v);
    // Each token is either no JWT, or a JWT claiming the issuer: never one of another issuer,
    // which the apiserver is rightly asked about.
    for round in 0..5000 {
        let random = |rng: &mut testkit::rng::Rng| match rng.below(3) {
            0 => b(&(0..rng.below(60))
                .map(|_| rng.next_u64() as u8)
                .collect::<Vec<_>>()),
            1 => b(["[]", "1", "\"x\"", "{", "null"][rng.below(5)].as_bytes()),
            _ => (0..rng.below(20))
                .map(|_| ['a', '-', '.', '=', '~'][rng.below(5)])
                .collect(),
        };
        let header = |rng: &mut testkit::rng::Rng| match rng.below(2) {
            0 => b(
                serde_json::json!({"alg": (["ES256", "RS256", "none", "HS256", ""][rng.below(5)]),
                    "kid": (["sa-key", "other", ""][rng.below(3)])})
                .to_string()
                .as_bytes(),
            ),
            _ => random(rng),
        };
        let payload = |rng: &mut testkit::rng::Rng| match rng.below(2) {
            0 => b(
                serde_json::json!({"iss": ISSUER, "exp": ([1.0, 1e12, f64::MAX][rng.below(3)]),
                    "nbf": rng.next_u64()})
                .to_string()
                .as_bytes(),
            ),
            _ => random(rng),
        };
        let token = match rng.below(3) {
            0 => (0..1 + rng.below(4))
                .map(|_| random(&mut rng))
                .collect::<Vec<_>>()
                .join("."),
            1 => format!(
                "{}.{}.{}",
                header(&mut rng),
                payload(&mut rng),
                random(&mut rng)
            ),
            _ => forged(&issuer.token(&format!("x{round}"), unix_now() - rng.below(10_000) as f64)),
        };
        let Ok(header) = format!("Bearer {token}").parse() else {
            continue;
        };
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, header);
        let refused = auth.check(&h).await.unwrap_err();
        assert_eq!(
            refused.0,
            StatusCode::UNAUTHORIZED,
            "seed {seed} round {round}: {token}"
        );
        assert_eq!(
            api.reviews.load(Ordering::SeqCst),
            0,
            "seed {seed} round {round} sent: {token}"
        );
    }
}
