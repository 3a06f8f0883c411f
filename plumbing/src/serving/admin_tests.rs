//! The admin server's endpoints, its HTTPS, its body limit and the `/metrics` check, over real
//! TCP against the server `admin::bind` builds.

use std::{net::SocketAddr, sync::Arc};

use tokio_util::sync::CancellationToken;

use crate::serving::admin::*;
use crate::{
    Readiness, metrics,
    metrics_auth::{Delegated, MetricsAuth},
    serving::{self, self_signed::Source},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: SocketAddr, path: &str) -> String {
    get_with(addr, path, "").await
}

/// A GET with `headers` (each line ending in \r\n).
async fn get_with(addr: SocketAddr, path: &str, headers: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn endpoints_answer_and_readyz_follows_watches() {
    let readiness = Readiness::default();
    let flag = readiness.register("pods");
    let token = CancellationToken::new();
    let registry = metrics::registry();
    registry.register(readiness.collector()).unwrap();
    let (addr, serve) = bind(
        "127.0.0.1:0".parse().unwrap(),
        registry,
        readiness,
        None,
        None,
        token.clone(),
    )
    .await
    .unwrap();
    let server = tokio::spawn(serve);

    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    let r = get(addr, "/readyz").await;
    assert!(r.starts_with("HTTP/1.1 503") && r.contains("pods"), "{r}");
    flag.mark_ready();
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    let m = get(addr, "/metrics").await;
    assert!(
        m.contains("groundskeeper_watch_stale_seconds{watch=\"pods\"} 0"),
        "{m}"
    );
    assert!(m.contains("process_resident_memory_bytes"), "{m}");

    token.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn readyz_fails_on_a_stale_watch_while_healthz_stays_up() {
    let readiness = crate::Readiness::new(crate::WatchSettings {
        stale_after: std::time::Duration::from_millis(50),
        backoff_max: std::time::Duration::from_secs(1),
        ..crate::WatchSettings::default()
    });
    let flag = readiness.register("podgc/nodes");
    flag.mark_ready();
    let token = CancellationToken::new();
    let (addr, serve) = bind(
        "127.0.0.1:0".parse().unwrap(),
        metrics::registry(),
        readiness,
        None,
        None,
        token.clone(),
    )
    .await
    .unwrap();
    let server = tokio::spawn(serve);
    flag.failed(&"connection refused", std::time::Duration::from_secs(1));
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let r = get(addr, "/readyz").await;
    assert!(
        r.starts_with("HTTP/1.1 503") && r.contains("podgc/nodes: not healthy for"),
        "{r}"
    );
    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    flag.mark_ready();
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    token.cancel();
    server.await.unwrap().unwrap();
}

/// Shaped as JWTs, as ServiceAccount tokens are.
const READER: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJyZWFkZXIifQ.c2lnbmF0dXJl";
const OTHER: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJvdGhlciJ9.c2lnbmF0dXJl";
const FORGED: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJmb3JnZWQifQ.c2lnbmF0dXJl";

/// An apiserver that knows two tokens: READER (a user allowed to get /metrics) and
/// OTHER (one that is not); counts the reviews it answers.
fn reviewing_apiserver(reviews: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> kube::Client {
    use kube::client::Body;
    let service = tower::service_fn(move |req: http::Request<Body>| {
        let reviews = reviews.clone();
        async move {
            if req.method() == http::Method::GET {
                // No issuer discovery: tokens are left to the reviews.
                let not_found = http::Response::builder().status(404);
                return Ok(not_found.body(Body::from(b"{}".to_vec())).unwrap());
            }
            reviews.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let path = req.uri().path().to_string();
            let body: serde_json::Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
            let answer = if path.ends_with("/tokenreviews") {
                let user = match body["spec"]["token"].as_str() {
                    Some(READER) => Some("system:serviceaccount:monitoring:prometheus"),
                    Some(OTHER) => Some("system:serviceaccount:default:someone"),
                    _ => None,
                };
                let mut r = body.clone();
                r["status"] = match user {
                    Some(u) => serde_json::json!({"authenticated": true,
                        "user": {"username": u, "groups": ["system:serviceaccounts"]}}),
                    None => serde_json::json!({"authenticated": false}),
                };
                r
            } else {
                let allowed = body["spec"]["user"] == "system:serviceaccount:monitoring:prometheus"
                    && body["spec"]["nonResourceAttributes"]["path"] == "/metrics"
                    && body["spec"]["nonResourceAttributes"]["verb"] == "get";
                let mut r = body.clone();
                r["status"] = serde_json::json!({"allowed": allowed});
                r
            };
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(201)
                    .body(Body::from(answer.to_string().into_bytes()))
                    .unwrap(),
            )
        }
    });
    kube::Client::new(service, "default")
}

/// Only whom RBAC allows may read /metrics: with `--metrics-auth=kubernetes`, /metrics answers only a token the
/// apiserver authenticates whose user may get /metrics; the probes' endpoints stay open;
/// a scraper's answer is reused, not asked again at every scrape.
#[tokio::test]
async fn metrics_only_to_authorized_callers_probes_open() {
    let reviews = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let readiness = Readiness::default();
    let token = CancellationToken::new();
    let (addr, serve) = bind(
        "127.0.0.1:0".parse().unwrap(),
        metrics::registry(),
        readiness,
        Some(Delegated::new(reviewing_apiserver(reviews.clone()), &metrics::registry()).unwrap()),
        None,
        token.clone(),
    )
    .await
    .unwrap();
    let server = tokio::spawn(serve);
    let bearer = |t: &str| format!("Authorization: Bearer {t}\r\n");
    for (headers, want) in [
        (String::new(), "HTTP/1.1 401"),
        ("Authorization: Basic eDp5\r\n".into(), "HTTP/1.1 401"),
        (bearer("forged"), "HTTP/1.1 401"),
        (bearer(FORGED), "HTTP/1.1 401"),
        (bearer(OTHER), "HTTP/1.1 403"),
        (bearer(READER), "HTTP/1.1 200"),
    ] {
        let headers = headers.as_str();
        let r = get_with(addr, "/metrics", headers).await;
        assert!(r.starts_with(want), "{headers:?}: {r}");
        assert_eq!(
            r.contains("process_resident_memory_bytes"),
            want.ends_with("200"),
            "{headers:?}: metrics only when allowed"
        );
    }
    for path in ["/healthz", "/livez", "/readyz"] {
        assert!(
            get(addr, path).await.starts_with("HTTP/1.1 200"),
            "{path} open to kubelet's probes"
        );
    }
    let asked = reviews.load(std::sync::atomic::Ordering::SeqCst);
    for _ in 0..5 {
        let r = get_with(addr, "/metrics", &bearer(READER)).await;
        assert!(r.starts_with("HTTP/1.1 200"));
    }
    assert_eq!(
        reviews.load(std::sync::atomic::Ordering::SeqCst),
        asked,
        "scrapes within a minute reuse the answer"
    );
    token.cancel();
    server.await.unwrap().unwrap();
}

#[test]
fn metrics_are_open_unless_asked() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        admin: AdminArgs,
    }
    use clap::Parser;
    let parse = |a: &[&str]| Cli::try_parse_from(std::iter::once("bin").chain(a.iter().copied()));
    assert_eq!(parse(&[]).unwrap().admin.metrics_auth, MetricsAuth::None);
    assert_eq!(
        parse(&["--metrics-auth=kubernetes"])
            .unwrap()
            .admin
            .metrics_auth,
        MetricsAuth::Kubernetes
    );
    let e = parse(&["--metrics-auth=basic"]).err().unwrap().to_string();
    assert!(e.contains("basic"), "{e}");
}

/// With TLS the admin server answers HTTPS (the certificate it was given), and nothing in
/// the clear; its limits hold either way (a body over the cap: 413, unread).
#[tokio::test]
async fn https_when_asked_and_bodies_bounded() {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    let hosts = vec!["127.0.0.1".to_string()];
    let (cert, key) = serving::self_signed::issue(&hosts, time::OffsetDateTime::now_utc()).unwrap();
    let certs = Arc::new(serving::Certificates::default());
    certs.load(cert.as_bytes(), key.as_bytes()).unwrap();
    let token = CancellationToken::new();
    let registry = metrics::registry();
    let (addr, serve) = bind(
        "127.0.0.1:0".parse().unwrap(),
        registry.clone(),
        Readiness::default(),
        None,
        Some(serving::server_config(certs).unwrap()),
        token.clone(),
    )
    .await
    .unwrap();
    let server = tokio::spawn(serve);

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(cert.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let https = |request: String| {
        let connector = connector.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let mut tls = connector.connect(name, tcp).await.unwrap();
            tls.write_all(request.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            let _ = tls.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).into_owned()
        }
    };
    let r = https("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into()).await;
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("process_resident_memory_bytes"),
        "{r}"
    );
    let r = https(format!(
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        1 << 20
    ))
    .await;
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");

    let plain = tokio::time::timeout(std::time::Duration::from_secs(10), get(addr, "/healthz"))
        .await
        .unwrap_or_default();
    assert!(!plain.contains("200"), "answered in the clear: {plain}");
    let m = metrics::render(&registry);
    assert!(
        m.contains("groundskeeper_admin_refused_total{reason=\"body_too_large\"} 1"),
        "{m}"
    );
    token.cancel();
    server.await.unwrap().unwrap();
}

#[test]
fn certificate_files_need_https_and_come_in_pairs() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        admin: AdminArgs,
    }
    use clap::Parser;
    let parse = |a: &[&str]| {
        Cli::try_parse_from(std::iter::once("bin").chain(a.iter().copied()))
            .map(|c| c.admin.certificate_source())
    };
    assert_eq!(parse(&[]).unwrap(), Ok(None));
    let Ok(Some(Source::SelfSigned { hosts })) = parse(&["--admin-scheme=https"]).unwrap() else {
        panic!("https without files: self-signed")
    };
    assert!(hosts.contains(&"localhost".to_string()), "{hosts:?}");
    let files = ["--admin-tls-cert-file=c", "--admin-tls-private-key-file=k"];
    assert!(
        parse(&files)
            .unwrap()
            .unwrap_err()
            .contains("--admin-scheme=https")
    );
    assert_eq!(
        parse(&["--admin-scheme=https", files[0], files[1]]).unwrap(),
        Ok(Some(Source::Files {
            cert: "c".into(),
            key: "k".into()
        }))
    );
    assert!(
        parse(&["--admin-scheme=https", files[0]]).is_err(),
        "a cert without its key"
    );
}
