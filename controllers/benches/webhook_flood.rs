//! The sysctl webhook under a flood of hostile callers (docs/security.md, "The webhook port"):
//! the real controller-manager, serving only the webhook, against a throwaway control plane;
//! FLOOD_BENCH_CLIENTS (100) clients at once, half sending the largest body the webhook takes (a
//! pod AdmissionReview of 3 MiB + 64 KiB, setting sysctls, judged in full) again and again, half
//! sending their headers a byte a second; meanwhile two legitimate clients send binding reviews
//! of pods the webhook has cached, over kept-alive connections, as the apiserver does.
//!
//!   KUBE_APISERVER=../shared/bin/kube-apiserver cargo bench -p groundskeeper-controllers --bench webhook_flood
//!
//! Prints the replica's peak RSS during the flood beside the chart's memory limit for the
//! controller-manager (256 MiB), and the legitimate reviews' p99 beside its bound (100 ms),
//! before and during the flood, and what the flood got (answers, 429s, 413s, cut-off headers).
//! It fails (exit 1) when either bound is broken. FLOOD_BENCH_SECONDS (20) is the flood's length.
//! Without KUBE_APISERVER or KUBECONFIG it prints one SKIPPED line and exits 0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use groundskeeper_controllers::sysctl::{tls::rotation, webhook::limits::MAX_BODY};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::ObjectMeta;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use testkit::figures::{env_num, figure, mib, status_kib};
use testkit::{Binary, free_addr, unique_name, wait_ready};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

const MEMORY_LIMIT_MIB: f64 = 256.0;
const P99_BOUND_MS: f64 = 100.0;
const PODS: usize = 50;
const WAIT: Duration = Duration::from_secs(60);

/// `bench <name> <value> <unit> (<bound>)`: a figure with the bound it must keep.
fn bounded(name: &str, value: f64, unit: &str, bound: &str) {
    println!("bench {name} {} ({bound})", figure(value, unit));
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    busy: AtomicU64,
    too_large: AtomicU64,
    other: AtomicU64,
    cut_off: AtomicU64,
}

struct Target {
    addr: SocketAddr,
    connector: TlsConnector,
}

impl Target {
    async fn connect(&self) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from("127.0.0.1").expect("an IP");
        self.connector.connect(name, tcp).await
    }
}

/// The status of the next response on `s`, its body read (by Content-Length) so the connection
/// can carry the next request.
async fn answer(s: &mut TlsStream<TcpStream>) -> Option<u16> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < end + len {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(code)
}

fn request(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path}?timeout=10s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn binding_review(ns: &str, pod: &Pod, node: &str, uid: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": format!("legit-{uid}"),
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding", "operation": "CREATE", "userInfo": {"username": "system:kube-scheduler"}, "namespace": ns,
            "object": {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod.metadata.name, "namespace": ns, "uid": pod.metadata.uid},
                "target": {"kind": "Node", "name": node}}},
    }))
    .expect("JSON")
}

/// A pod CREATE review of exactly `size` bytes: a pod on `node` setting a sysctl, padded with an
/// annotation, so the webhook reads, parses and judges all of it.
fn maximal_review(ns: &str, node: &str, size: usize) -> Vec<u8> {
    let review = |pad: usize| {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "flood",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE", "userInfo": {"username": "system:kube-scheduler"}, "namespace": ns,
                "object": {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "flood", "annotations": {"pad": "x".repeat(pad)}},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}],
                        "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}}},
        }))
        .expect("JSON")
    };
    let bare = review(0).len();
    let body = review(size - bare);
    assert_eq!(body.len(), size);
    body
}

/// Sends maximal bodies until `stop`, reconnecting whenever the server closes.
async fn large_bodies(
    target: Arc<Target>,
    body: Arc<Vec<u8>>,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
) {
    let req = request("/validate/pod", &body);
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = target.connect().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            if s.write_all(&req).await.is_err() {
                break;
            }
            let counter = match answer(&mut s).await {
                Some(200) => &tally.ok,
                Some(429) => &tally.busy,
                Some(413) => &tally.too_large,
                Some(_) => &tally.other,
                None => break,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sends a request's headers a byte a second until the server cuts it off, then again.
async fn slow_headers(target: Arc<Target>, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let head =
        b"POST /validate/binding HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = target.connect().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        for b in head.iter().cycle() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if s.write_all(&[*b]).await.is_err() {
                break;
            }
            // A closed connection shows on the read side first.
            let mut byte = [0u8; 1];
            match tokio::time::timeout(Duration::from_secs(1), s.read(&mut byte)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                _ => {}
            }
        }
        tally.cut_off.fetch_add(1, Ordering::Relaxed);
    }
}

/// One legitimate client: binding reviews of the cached pods in turn on one kept-alive
/// connection (a new one when the server closes it), each answer timed.
async fn legitimate(
    target: Arc<Target>,
    reviews: Arc<Vec<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    offset: usize,
) -> (Vec<Duration>, u64) {
    let mut took = Vec::new();
    let mut failed = 0;
    let mut conn: Option<TlsStream<TcpStream>> = None;
    let mut i = offset;
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let mut s = match conn.take() {
            Some(s) => s,
            None => match target.connect().await {
                Ok(s) => s,
                Err(_) => {
                    failed += 1;
                    continue;
                }
            },
        };
        let req = request("/validate/binding", &reviews[i % reviews.len()]);
        i += 1;
        let ok = s.write_all(&req).await.is_ok() && answer(&mut s).await == Some(200);
        if ok {
            took.push(start.elapsed());
            conn = Some(s);
        } else {
            failed += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (took, failed)
}

fn p99_ms(mut took: Vec<Duration>) -> f64 {
    if took.is_empty() {
        return f64::INFINITY;
    }
    took.sort();
    let i = ((took.len() as f64) * 0.99).ceil() as usize - 1;
    took[i.min(took.len() - 1)].as_secs_f64() * 1000.0
}

/// The legitimate clients for `secs`: their p99 (ms), how many answered, how many failed. They
/// run on a runtime and thread of their own, so that the flood's clients in this process (their
/// TLS and JSON work) do not delay them before the request leaves or after the answer comes.
async fn measure(
    target: &Arc<Target>,
    reviews: &Arc<Vec<Vec<u8>>>,
    secs: u64,
) -> (f64, usize, u64) {
    let (target, reviews) = (target.clone(), reviews.clone());
    let (took, failed) = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            let stop = Arc::new(AtomicBool::new(false));
            let clients: Vec<_> = (0..2)
                .map(|k| {
                    tokio::spawn(legitimate(
                        target.clone(),
                        reviews.clone(),
                        stop.clone(),
                        k * 7,
                    ))
                })
                .collect();
            tokio::time::sleep(Duration::from_secs(secs)).await;
            stop.store(true, Ordering::Relaxed);
            let (mut took, mut failed) = (Vec::new(), 0);
            for c in clients {
                let (t, f) = c.await.expect("legitimate client");
                took.extend(t);
                failed += f;
            }
            (took, failed)
        })
    })
    .await
    .expect("the legitimate clients' thread");
    let n = took.len();
    (p99_ms(took), n, failed)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("webhook_flood").await else {
        return Ok(());
    };
    let clients = env_num("FLOOD_BENCH_CLIENTS", 100);
    let secs = env_num("FLOOD_BENCH_SECONDS", 20) as u64;
    c.ensure_crd(&groundskeeper_sysctl_rules::crd::crd_yaml())
        .await?;
    let ns = c.namespace_for_pods("gk-flood", WAIT).await?;
    let node = unique_name("gk-flood-node");
    c.create(&testkit::webhook::node(
        &node,
        Default::default(),
        Some("6.1.0"),
    ))
    .await?;
    // The serving certificate, as cert-manager would write it.
    let g = rotation::issue(
        &["127.0.0.1".to_string()],
        jiff::Timestamp::now(),
        Duration::from_secs(86_400),
    )?;
    let secret = unique_name("gk-flood-tls");
    let data = [("tls.crt", &g.cert), ("tls.key", &g.key), ("ca.crt", &g.ca)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
    c.create(&Secret {
        metadata: ObjectMeta {
            name: Some(secret.clone()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    })
    .await?;
    // Pods waiting to be bound: the webhook's cache holds them, as it holds every pod the
    // scheduler is about to bind.
    let mut pods = Vec::new();
    for i in 0..PODS {
        let mut p = testkit::bound_pod(&ns, &format!("legit-{i}"), "");
        p.spec.as_mut().expect("a spec").node_name = None;
        p.spec.as_mut().expect("a spec").security_context =
            Some(testkit::sysctls(&["kernel.shm_rmid_forced"]));
        pods.push(c.create(&p).await?);
    }
    let reviews: Arc<Vec<Vec<u8>>> = Arc::new(
        pods.iter()
            .enumerate()
            .map(|(i, p)| binding_review(&ns, p, &node, i as u64))
            .collect(),
    );

    let addr = free_addr();
    let args = [
        "--leader-elect=false".to_string(),
        "--controllers=".into(),
        "--sysctl-webhook".into(),
        format!("--webhook-addr={addr}"),
        "--webhook-certificates=secret".into(),
        format!("--webhook-tls-secret={secret}"),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (bin, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-webhook-flood",
        &args,
        &[("POD_NAMESPACE", ns.as_str())],
    )?;
    wait_ready(admin, WAIT, "controller-manager /readyz")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlog:\n{}", bin.logs()))?;
    let pid = bin.pid().expect("running");

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(g.ca.as_bytes())?)?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let target = Arc::new(Target {
        addr,
        connector: TlsConnector::from(Arc::new(config)),
    });

    let (p99_quiet, n_quiet, failed_quiet) = measure(&target, &reviews, 5).await;
    let rss_quiet = mib(status_kib(pid, "VmRSS:"));
    bounded(
        "webhook_quiet_legit_p99_ms",
        p99_quiet,
        "ms",
        &format!("{n_quiet} answered, {failed_quiet} failed"),
    );

    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let body = Arc::new(maximal_review(&ns, &node, MAX_BODY));
    let mut flood = Vec::new();
    for i in 0..clients {
        let (t, s, tally) = (target.clone(), stop.clone(), tally.clone());
        flood.push(if i % 2 == 0 {
            tokio::spawn(large_bodies(t, body.clone(), tally, s))
        } else {
            tokio::spawn(slow_headers(t, tally, s))
        });
    }
    // Peak RSS while the flood runs, sampled (VmHWM would include the start-up).
    let sampling = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut peak = 0u64;
            while !stop.load(Ordering::Relaxed) {
                peak = peak.max(status_kib(pid, "VmRSS:"));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (p99, n, failed) = measure(&target, &reviews, secs).await;
    stop.store(true, Ordering::Relaxed);
    let peak = mib(sampling.await?);
    for f in flood {
        let _ = tokio::time::timeout(Duration::from_secs(5), f).await;
    }
    let metrics = testkit::http_get(admin, "/metrics").await?.1;
    let refused: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("groundskeeper_sysctl_webhook_refused_total{"))
        .collect();

    bounded(
        "webhook_flood_rss_mib",
        peak,
        "MiB",
        &format!("limit {MEMORY_LIMIT_MIB} MiB; {rss_quiet:.1} MiB before the flood"),
    );
    bounded(
        "webhook_flood_legit_p99_ms",
        p99,
        "ms",
        &format!("bound {P99_BOUND_MS} ms; {n} answered, {failed} failed"),
    );
    let t = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "flood: {clients} clients for {secs} s: maximal bodies answered {}, 429 {}, 413 {}, other {}; slow headers cut off {}",
        t(&tally.ok),
        t(&tally.busy),
        t(&tally.too_large),
        t(&tally.other),
        t(&tally.cut_off)
    );
    println!("replica: {}", refused.join(" "));
    if peak >= MEMORY_LIMIT_MIB || p99 >= P99_BOUND_MS || failed > 0 {
        eprintln!("FAIL: a bound was broken (see above)\nlog:\n{}", bin.logs());
        std::process::exit(1);
    }
    Ok(())
}
