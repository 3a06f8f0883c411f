//! `--metrics-auth=kubernetes` against a real apiserver: the node-agent serves `/metrics` only
//! to a bearer token whose user RBAC allows `get` on the non-resource URL `/metrics`
//! (TokenReview, then SubjectAccessReview), while `/healthz` and `/readyz` stay open for
//! kubelet's probes; and a flood of made-up tokens costs the apiserver only the agent's budget
//! of checks, while the agent's watches and readiness carry on.

use std::time::Duration;

use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    core::v1::{Node, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject},
};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use testkit::{Binary, free_addr, unique_name, wait_for, wait_ready};

fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(Into::into),
        ..Default::default()
    }
}

/// A ServiceAccount in `ns`, bound to `role` when given; a token of it.
async fn token_of(c: &testkit::Cluster, ns: &str, role: Option<&str>) -> anyhow::Result<String> {
    let name = unique_name("scraper");
    c.create(&ServiceAccount {
        metadata: meta(&name, Some(ns)),
        ..Default::default()
    })
    .await?;
    if let Some(role) = role {
        c.create(&ClusterRoleBinding {
            metadata: meta(&name, None),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: role.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.clone(),
                namespace: Some(ns.into()),
                ..Default::default()
            }]),
        })
        .await?;
    }
    let sa: Api<ServiceAccount> = Api::namespaced(c.client.clone(), ns);
    let t = sa
        .create_token_request(&name, &PostParams::default(), &TokenRequest::default())
        .await?;
    Ok(t.status.map(|s| s.token).unwrap_or_default())
}

async fn get(admin: std::net::SocketAddr, path: &str, token: Option<&str>) -> anyhow::Result<u16> {
    Ok(get_body(admin, path, token).await?.0)
}

/// Where a flood comes from: another address than the probes' and the scrapers' (127.0.0.1),
/// as a hostile pod is another caller than the kubelet and Prometheus. The admin server holds
/// each source address to a fair share of its connections, so a flood from the probes' own
/// address is another test (the serving tests' `slow_clients`).
const FLOOD_SOURCE: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);

/// [`get`] from [`FLOOD_SOURCE`].
async fn flood_get(
    admin: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((FLOOD_SOURCE, 0).into())?;
    let mut s = socket.connect(admin).await?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

/// The status and body of a GET of `path`, with `token` as bearer when given.
async fn get_body(
    admin: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(admin).await?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, out))
}

#[tokio::test]
async fn metrics_only_to_callers_rbac_allows() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("metrics_only_to_callers_rbac_allows").await else {
        return Ok(());
    };
    c.ensure_crd(&groundskeeper_node_agent::sysctlreport::crd::crd_yaml())
        .await?;
    let ns = c.namespace("metrics-auth").await?;
    let node = unique_name("gk-metrics");
    c.create(&Node {
        metadata: meta(&node, None),
        ..Default::default()
    })
    .await?;
    // What a Prometheus is bound to (the chart ships it as <release>-metrics-reader).
    let reader = unique_name("metrics-reader");
    c.create(&ClusterRole {
        metadata: meta(&reader, None),
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
        ..Default::default()
    })
    .await?;
    let allowed = token_of(&c, &ns, Some(&reader)).await?;
    let other = token_of(&c, &ns, None).await?;

    let admin = free_addr();
    let admin_s = admin.to_string();
    let _agent = Binary::start(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-metrics-auth",
        &[
            "--admin-addr",
            &admin_s,
            "--tasks=sysctl",
            "--metrics-auth=kubernetes",
        ],
        &[("NODE_NAME", node.as_str())],
    )?;
    wait_ready(admin, Duration::from_secs(60), "readyz without a token").await?;
    assert_eq!(get(admin, "/healthz", None).await?, 200);
    assert_eq!(get(admin, "/metrics", None).await?, 401, "no token");
    assert_eq!(
        get(admin, "/metrics", Some("not-a-token")).await?,
        401,
        "a token the apiserver does not accept"
    );
    assert_eq!(
        get(admin, "/metrics", Some(&other)).await?,
        403,
        "a ServiceAccount RBAC does not allow"
    );
    assert_eq!(
        get(admin, "/metrics", Some(&allowed)).await?,
        200,
        "bound to the metrics reader role"
    );
    Ok(())
}

/// A made-up token shaped as a ServiceAccount token (a JWT), distinct for each `i`.
fn made_up_token(i: usize) -> String {
    // {"alg":"RS256","kid":"flood"} . {"sub":"flood-<i>"} . a signature of the right length
    format!(
        "eyJhbGciOiJSUzI1NiIsImtpZCI6ImZsb29kIn0.{}.{}",
        base64url(format!("{{\"sub\":\"flood-{i}\"}}").as_bytes()),
        "c2ln".repeat(86)
    )
}

fn base64url(bytes: &[u8]) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, b| (n << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// The value of `name` in a Prometheus text body.
fn value(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// 2,000 distinct made-up JWT-shaped tokens from 50 clients at once: at most 100 TokenReviews
/// reach the apiserver (counted in its audit log, and printed), `/readyz` answers 200
/// throughout, a scraper allowed before the flood keeps reading `/metrics`, and the agent's
/// pod watch stays current: a pod bound to its node during the flood is checked while the flood
/// goes on. The TokenReviews come from the agent's own client for them (user agent
/// `...; metrics-auth`), not the one its watches share.
#[tokio::test]
async fn a_flood_of_made_up_tokens_costs_only_the_budget() -> anyhow::Result<()> {
    const TEST: &str = "a_flood_of_made_up_tokens_costs_only_the_budget";
    let Some(c) = testkit::cluster(TEST).await else {
        return Ok(());
    };
    let Some(cp) = c.control_plane else {
        testkit::skipped(
            TEST,
            "counts TokenReviews in the test control plane's audit log",
        );
        return Ok(());
    };
    c.ensure_crd(&groundskeeper_node_agent::sysctlreport::crd::crd_yaml())
        .await?;
    let ns = c
        .namespace_for_pods("metrics-flood", Duration::from_secs(30))
        .await?;
    let node = unique_name("gk-metrics-flood");
    c.create(&Node {
        metadata: meta(&node, None),
        ..Default::default()
    })
    .await?;
    let reader = unique_name("metrics-reader");
    c.create(&ClusterRole {
        metadata: meta(&reader, None),
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
        ..Default::default()
    })
    .await?;
    let scraper = token_of(&c, &ns, Some(&reader)).await?;
    let instance = unique_name("node-agent-flood");
    let admin = free_addr();
    let admin_s = admin.to_string();
    let _agent = Binary::start(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-metrics-flood",
        &[
            "--admin-addr",
            &admin_s,
            "--tasks=sysctl",
            "--metrics-auth=kubernetes",
        ],
        &[
            ("NODE_NAME", node.as_str()),
            ("POD_NAME", instance.as_str()),
        ],
    )?;
    wait_ready(admin, Duration::from_secs(60), "readyz").await?;
    let checked = || async {
        let (code, body) = get_body(admin, "/metrics", Some(&scraper)).await?;
        anyhow::ensure!(code == 200, "the scraper got {code}");
        Ok::<_, anyhow::Error>(
            value(&body, "groundskeeper_sysctl_pods_checked_total").unwrap_or(0.0),
        )
    };
    let before = checked().await?;

    let flooding = Arc::new(AtomicBool::new(true));
    let readyz_failures = Arc::new(AtomicUsize::new(0));
    let readyz = {
        let (flooding, failures) = (flooding.clone(), readyz_failures.clone());
        tokio::spawn(async move {
            let mut probes = 0;
            while flooding.load(Ordering::SeqCst) {
                if get(admin, "/readyz", None).await.unwrap_or(0) != 200 {
                    failures.fetch_add(1, Ordering::SeqCst);
                }
                probes += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            probes
        })
    };
    // Each client sends its 40 tokens, then again until the pod below has been seen: the
    // flood is on all the while the watch is put to the test.
    let seen = Arc::new(AtomicBool::new(false));
    let statuses = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        u16,
        usize,
    >::new()));
    let clients: Vec<_> = (0..50)
        .map(|k| {
            let (seen, statuses) = (seen.clone(), statuses.clone());
            tokio::spawn(async move {
                let tokens: Vec<String> = (0..40).map(|i| made_up_token(k * 40 + i)).collect();
                let mut round = 0;
                while round == 0 || !seen.load(Ordering::SeqCst) {
                    for t in &tokens {
                        let code = flood_get(admin, "/metrics", Some(t)).await.unwrap_or(0);
                        *statuses.lock().unwrap().entry(code).or_default() += 1;
                    }
                    round += 1;
                }
            })
        })
        .collect();
    let mut pod = testkit::bound_pod(&ns, "bound-during-the-flood", &node);
    pod.spec.as_mut().unwrap().security_context =
        Some(testkit::sysctls(&["kernel.shm_rmid_forced"]));
    let created = std::time::Instant::now();
    c.create(&pod).await?;
    wait_for(
        Duration::from_secs(30),
        "the agent to check the pod bound during the flood",
        || async { Ok(checked().await? > before) },
    )
    .await?;
    let lag = created.elapsed();
    seen.store(true, Ordering::SeqCst);
    for client in clients {
        client.await?;
    }
    flooding.store(false, Ordering::SeqCst);
    let probes = readyz.await?;
    // The audit log is written as requests complete: give the last lines a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reviews: Vec<_> = testkit::audit::read(&cp.audit_log)?
        .into_iter()
        .filter(|e| e.object_ref.resource == "tokenreviews" && e.user_agent.contains(&instance))
        .collect();
    let statuses = statuses.lock().unwrap().clone();
    println!(
        "bench metrics_auth_flood_tokenreviews {} (bound 100; 2000 distinct tokens, answers {statuses:?})",
        reviews.len()
    );
    println!(
        "bench metrics_auth_flood_watch_lag_ms {} (a pod bound during the flood, checked by the agent)",
        lag.as_millis()
    );
    assert!(
        reviews.len() <= 100,
        "{} TokenReviews reached the apiserver",
        reviews.len()
    );
    assert!(
        !reviews.is_empty(),
        "no TokenReview counted: the audit log filter is wrong"
    );
    for e in &reviews {
        assert!(
            e.user_agent.ends_with("; metrics-auth)"),
            "a TokenReview from another client: {}",
            e.user_agent
        );
    }
    assert_eq!(
        readyz_failures.load(Ordering::SeqCst),
        0,
        "/readyz failed during the flood ({probes} probes)"
    );
    assert!(probes > 0);
    assert_eq!(
        statuses
            .keys()
            .copied()
            // 0: closed at the accept, the flood's source being over its share of connections.
            .filter(|c| ![0, 401, 429].contains(c))
            .collect::<Vec<_>>(),
        Vec::<u16>::new(),
        "made-up tokens get 401 or 429 only: {statuses:?}"
    );
    Ok(())
}

/// The test control plane's ServiceAccount issuer (`--service-account-issuer`).
const ISSUER: &str = "https://kubernetes.default.svc";

/// `token` with one character of its signature changed.
fn forged(token: &str) -> String {
    let (signed, signature) = token.rsplit_once('.').unwrap();
    let mut s = signature.as_bytes().to_vec();
    let i = s.len() / 2;
    s[i] = if s[i] == b'A' { b'B' } else { b'A' };
    format!("{signed}.{}", String::from_utf8(s).unwrap())
}

/// A made-up token claiming the issuer, distinct for each `i`: `real`'s header (its key id)
/// and signature over claims of its own.
fn claiming_the_issuer(real: &str, i: usize) -> String {
    let (header, rest) = real.split_once('.').unwrap();
    let signature = rest.rsplit_once('.').unwrap().1;
    let claims = format!(
        "{{\"iss\":\"{ISSUER}\",\"sub\":\"system:serviceaccount:flood:f{i}\",\"exp\":4102444800}}"
    );
    format!("{header}.{}.{signature}", base64url(claims.as_bytes()))
}

/// Against the apiserver's real keys (`/openid/v1/jwks`): a real ServiceAccount token
/// (TokenRequest) is verified and served; the same token with one character of its signature
/// changed is refused 401 without a TokenReview; and during a flood of 10,000 made-up tokens
/// claiming the issuer from 50 clients, a NEW scraper (a token never seen, requested
/// mid-flood) is served, not 429. The apiserver's audit log proves the forgeries cost no
/// TokenReview: the agent sends exactly the scrapers' (printed).
#[tokio::test]
async fn forged_service_account_tokens_cost_no_review_and_lock_no_scraper_out() -> anyhow::Result<()>
{
    const TEST: &str = "forged_service_account_tokens_cost_no_review_and_lock_no_scraper_out";
    let Some(c) = testkit::cluster(TEST).await else {
        return Ok(());
    };
    let Some(cp) = c.control_plane else {
        testkit::skipped(
            TEST,
            "counts TokenReviews in the test control plane's audit log",
        );
        return Ok(());
    };
    c.ensure_crd(&groundskeeper_node_agent::sysctlreport::crd::crd_yaml())
        .await?;
    let ns = c.namespace("metrics-forged").await?;
    let node = unique_name("gk-metrics-forged");
    c.create(&Node {
        metadata: meta(&node, None),
        ..Default::default()
    })
    .await?;
    let reader = unique_name("metrics-reader");
    c.create(&ClusterRole {
        metadata: meta(&reader, None),
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
        ..Default::default()
    })
    .await?;
    let scraper = token_of(&c, &ns, Some(&reader)).await?;
    let instance = unique_name("node-agent-forged");
    let admin = free_addr();
    let admin_s = admin.to_string();
    let _agent = Binary::start(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-metrics-forged",
        &[
            "--admin-addr",
            &admin_s,
            "--tasks=sysctl",
            "--metrics-auth=kubernetes",
        ],
        &[
            ("NODE_NAME", node.as_str()),
            ("POD_NAME", instance.as_str()),
        ],
    )?;
    wait_ready(admin, Duration::from_secs(60), "readyz").await?;

    let (code, body) = get_body(admin, "/metrics", Some(&forged(&scraper))).await?;
    assert_eq!(code, 401, "{body}");
    assert!(
        body.contains("signature does not verify"),
        "refused by the keys: {body}"
    );
    assert_eq!(
        get(admin, "/metrics", Some(&scraper)).await?,
        200,
        "the real token"
    );

    let statuses = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        u16,
        usize,
    >::new()));
    let clients: Vec<_> = (0..50)
        .map(|k| {
            let (statuses, scraper) = (statuses.clone(), scraper.clone());
            tokio::spawn(async move {
                for i in 0..200 {
                    let t = claiming_the_issuer(&scraper, k * 200 + i);
                    let code = flood_get(admin, "/metrics", Some(&t)).await.unwrap_or(0);
                    *statuses.lock().unwrap().entry(code).or_default() += 1;
                }
            })
        })
        .collect();
    wait_for(Duration::from_secs(60), "the flood under way", || async {
        Ok(statuses.lock().unwrap().values().sum::<usize>() >= 2000)
    })
    .await?;
    let new_scraper = token_of(&c, &ns, Some(&reader)).await?;
    let new_code = get(admin, "/metrics", Some(&new_scraper)).await?;
    let sent_before = statuses.lock().unwrap().values().sum::<usize>();
    for client in clients {
        client.await?;
    }
    let statuses = statuses.lock().unwrap().clone();
    let (_, body) = get_body(admin, "/metrics", Some(&scraper)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reviews = testkit::audit::read(&cp.audit_log)?
        .into_iter()
        .filter(|e| e.object_ref.resource == "tokenreviews" && e.user_agent.contains(&instance))
        .count();
    println!(
        "bench metrics_auth_forged_flood_tokenreviews {reviews} (2 scrapers; 10000 forged tokens, answers {statuses:?}; the new scraper answered {new_code} after {sent_before})"
    );
    assert_eq!(new_code, 200, "a new scraper mid-flood: {statuses:?}");
    assert!(
        sent_before < 10_000,
        "the new scraper came after the flood: {sent_before}"
    );
    // Every forgery answered is refused 401; the rest were closed at the accept, the flood's
    // source being over its share of the admin server's connections (0: no answer).
    assert_eq!(statuses.values().sum::<usize>(), 10_000, "{statuses:?}");
    assert!(
        statuses.keys().all(|c| [0, 401].contains(c)) && statuses.contains_key(&401),
        "every forgery answered is refused 401: {statuses:?}"
    );
    assert_eq!(reviews, 2, "TokenReviews: the two scrapers' only");
    assert!(
        value(
            &body,
            "groundskeeper_metrics_auth_refused_total{reason=\"bad_signature\"}"
        )
        .is_some_and(|v| v >= statuses[&401] as f64 + 1.0),
        "counted as bad_signature: every forgery answered, and the one token forged first"
    );
    Ok(())
}
