//! The webhook server's limits, each proved over real TCP and TLS against the real server
//! code (short times, small caps): a body over the cap gets 413 unread, headers or a body too
//! slow are cut off, requests over the cap wait boundedly and then get 429, a connection over
//! a cap is closed at once or replaces an idle one, never waiting.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use groundskeeper_plumbing::client::ratelimit::Budget;
use groundskeeper_plumbing::watch::cache::{Health, Shared};
use groundskeeper_sysctl_rules::args::PolicyArgs;
use groundskeeper_sysctl_rules::crd::Mode;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

use groundskeeper_plumbing::serving::{Certificates, Limits, bind, limited, server_config};

use super::metrics::Metrics;
use super::serve::{Lookups, Reviewer, router};

/// A served webhook: where it listens, a TLS client for it, its metrics.
struct Served {
    addr: SocketAddr,
    connector: TlsConnector,
    metrics: Metrics,
    token: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

fn short() -> Limits {
    Limits {
        name: "test webhook",
        connections: 16,
        source_connections: 16,
        handshakes: 8,
        source_handshakes: 8,
        handshake_timeout: Duration::from_millis(500),
        header_timeout: Duration::from_millis(300),
        body_timeout: Duration::from_millis(300),
        body_grace: Duration::from_secs(1),
        body_min_rate: 64 << 10,
        slow_bodies: 4,
        answer_timeout: Duration::from_secs(5),
        max_body: 256 << 10,
        small_body: 4 << 10,
        small_in_flight: 2,
        source_in_flight: 8,
        large_in_flight: 1,
        large_answering: 1,
        queue_wait: Duration::from_millis(200),
    }
}

async fn served(limits: Limits) -> Served {
    let g = crate::sysctl::tls::rotation::issue(
        &["127.0.0.1".to_string()],
        jiff::Timestamp::now(),
        Duration::from_secs(3600),
    )
    .unwrap();
    let certs = Arc::new(Certificates::default());
    certs.load(g.cert.as_bytes(), g.key.as_bytes()).unwrap();
    let metrics = Metrics::register(&prometheus::Registry::new()).unwrap();
    let token = CancellationToken::new();
    let mock = testkit::api::Mock::answering(&[]);
    let reviewer = Arc::new(Reviewer {
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
        metrics: metrics.clone(),
    });
    let app = limited(router(reviewer), &limits, metrics.counters());
    let (addr, serve) = bind(
        "127.0.0.1:0".parse().unwrap(),
        "--webhook-addr",
        Some(server_config(certs).unwrap()),
        app,
        limits,
        metrics.counters(),
        token.clone(),
    )
    .await
    .unwrap();
    tokio::spawn(serve);

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(g.ca.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    Served {
        addr,
        connector: TlsConnector::from(Arc::new(config)),
        metrics,
        token,
    }
}

impl Served {
    async fn connect(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        self.connector.connect(name, tcp).await.unwrap()
    }

    fn refused(&self, reason: &str) -> u64 {
        self.metrics.refused.with_label_values(&[reason]).get()
    }
}

/// A binding review of `len` bytes or more (padded with a field the webhook ignores).
fn review(pad: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding", "operation": "CREATE", "userInfo": {"username": "system:kube-scheduler"}, "namespace": "ns",
            "object": {"metadata": {"name": "p"}, "target": {"name": "n1"}}},
        "pad": "x".repeat(pad),
    });
    serde_json::to_vec(&body).unwrap()
}

fn post(body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST /validate/binding HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

/// The status line's code of the next response on `s`, reading until the headers end.
async fn status(s: &mut TlsStream<TcpStream>) -> Option<(u16, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_string();
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, head))
}

/// Reads until the server closes: true when it did within `within`.
async fn closed_within(s: &mut TlsStream<TcpStream>, within: Duration) -> bool {
    let mut chunk = [0u8; 4096];
    let until = Instant::now() + within;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut chunk)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn a_body_over_the_cap_gets_413_unread() {
    let w = served(short()).await;
    let mut s = w.connect().await;
    // Declared too large: refused on the headers, before a byte of the body is sent.
    let head = format!(
        "POST /validate/binding HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        (256 << 10) + 1
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let (code, head) = status(&mut s).await.expect("an answer");
    assert_eq!(code, 413, "{head}");
    assert!(closed_within(&mut s, Duration::from_secs(2)).await);
    // Not declared (chunked), and over the cap: 413 once the cap is reached.
    let mut s = w.connect().await;
    s.write_all(
        b"POST /validate/binding HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await
    .unwrap();
    // Exactly one byte over the cap, and no more: the server has read all that was sent when
    // it answers, so its close can not reset the answer away.
    let chunk = vec![b'x'; 64 << 10];
    for c in [&chunk[..], &chunk[..], &chunk[..], &chunk[..], &b"x"[..]] {
        s.write_all(format!("{:x}\r\n", c.len()).as_bytes())
            .await
            .unwrap();
        s.write_all(c).await.unwrap();
        s.write_all(b"\r\n").await.unwrap();
    }
    let (code, _) = status(&mut s).await.expect("an answer");
    assert_eq!(code, 413);
    assert_eq!(w.refused("body_too_large"), 2);
    // Under the cap, in the narrow lane: answered.
    let mut s = w.connect().await;
    s.write_all(&post(&review(100 << 10))).await.unwrap();
    let (code, head) = status(&mut s).await.unwrap();
    assert_eq!(code, 200, "{head}");
}

#[tokio::test]
async fn slow_headers_and_idle_connections_are_cut_off() {
    let w = served(short()).await;
    let mut slow = w.connect().await;
    slow.write_all(b"POST /validate/binding HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    assert!(
        closed_within(&mut slow, Duration::from_secs(3)).await,
        "headers never finished: the connection must be closed"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "{:?}",
        start.elapsed()
    );
    // A connection kept alive after an answer is closed when idle as long.
    let mut idle = w.connect().await;
    idle.write_all(&post(&review(0))).await.unwrap();
    assert_eq!(status(&mut idle).await.unwrap().0, 200);
    assert!(closed_within(&mut idle, Duration::from_secs(3)).await);
    assert!(w.refused("header_timeout") >= 1);
    // A body that does not arrive in time: 408.
    let mut s = w.connect().await;
    s.write_all(b"POST /validate/binding HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    assert_eq!(status(&mut s).await.unwrap().0, 408);
    assert_eq!(w.refused("body_timeout"), 1);
}

/// Two requests hold the wide lane (their bodies trickle); a third waits `queue_wait`, then
/// gets 429 with Retry-After; once the lane frees, requests are answered again.
#[tokio::test]
async fn requests_over_the_cap_wait_boundedly_then_get_429() {
    let w = served(Limits {
        body_timeout: Duration::from_secs(3),
        ..short()
    })
    .await;
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut s = w.connect().await;
        s.write_all(b"POST /validate/binding HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            .await
            .unwrap();
        holders.push(s);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut third = w.connect().await;
    let start = Instant::now();
    third.write_all(&post(&review(0))).await.unwrap();
    let (code, head) = status(&mut third).await.unwrap();
    // 429, not 200: it was refused while the holders still held the lane, after queueing.
    assert_eq!(code, 429, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(w.refused("busy"), 1);
    // The narrow lane is its own: a large body is not held up by the wide one.
    let mut large = w.connect().await;
    large.write_all(&post(&review(8 << 10))).await.unwrap();
    assert_eq!(status(&mut large).await.unwrap().0, 200);
    for mut h in holders {
        assert_eq!(status(&mut h).await.unwrap().0, 408);
    }
    let mut s = w.connect().await;
    s.write_all(&post(&review(0))).await.unwrap();
    assert_eq!(status(&mut s).await.unwrap().0, 200);
}

/// At the connection cap a new connection is served at once, in the place of the oldest one
/// waiting for a request (which is closed); a client that opens TCP and never speaks TLS is
/// replaced by the next connection from its address at once, and alone is dropped at the
/// handshake timeout. Nothing waits for a slot.
#[tokio::test]
async fn connections_over_their_caps_replace_an_idle_one_at_once() {
    let w = served(Limits {
        connections: 2,
        source_connections: 2,
        handshakes: 1,
        source_handshakes: 1,
        ..short()
    })
    .await;
    let mut first = w.connect().await;
    let mut second = w.connect().await;
    second.write_all(&post(&review(0))).await.unwrap();
    assert_eq!(status(&mut second).await.unwrap().0, 200);
    let mut third = tokio::time::timeout(Duration::from_millis(500), w.connect())
        .await
        .expect("a third connection at a cap of 2 is served at once");
    assert!(
        closed_within(&mut first, Duration::from_secs(1)).await,
        "the oldest idle connection makes room"
    );
    third.write_all(&post(&review(0))).await.unwrap();
    assert_eq!(status(&mut third).await.unwrap().0, 200);
    assert_eq!(w.refused("replaced"), 1);
    drop((second, third));

    // One mute client holds the only handshake slot: the next connection replaces it at once.
    let _mute = TcpStream::connect(w.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    let mut s = tokio::time::timeout(Duration::from_secs(3), w.connect())
        .await
        .expect("served");
    assert!(
        start.elapsed() < Duration::from_millis(400),
        "waited for the mute one's handshake timeout: {:?}",
        start.elapsed()
    );
    s.write_all(&post(&review(0))).await.unwrap();
    assert_eq!(status(&mut s).await.unwrap().0, 200);
    assert_eq!(w.refused("replaced"), 2);
    drop(s);
    // Alone, a mute client is dropped at the handshake timeout.
    let mut mute = TcpStream::connect(w.addr).await.unwrap();
    let mut byte = [0u8; 1];
    let start = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(3), mute.read(&mut byte)).await;
    assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(w.refused("handshake_timeout"), 1);
}
