//! The controller-manager's two servers under hostile callers, on loopback, with no cluster:
//! the admin server as the binary builds it (`admin::bind` over HTTPS) and the sysctl webhook
//! server (`serving::bind` with the webhook's own limits and router). From 127.0.0.2 (another
//! pod, to the node's kubelet), each port gets 500 silent TCP connections and the webhook
//! headers and bodies dribbled a byte at a time (bodies declared small, large, and chunked),
//! each connection opened again once closed. Meanwhile, from 127.0.0.1, a probe GETs `/readyz`
//! every 100 ms and a legitimate client sends binding reviews every 20 ms, each on a new
//! connection: every probe is answered 200 within 1 s, every review 200. Prints the p99s.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use groundskeeper_controllers::sysctl::webhook::{limits, metrics::Metrics, serve};
use groundskeeper_plumbing::client::ratelimit::Budget;
use groundskeeper_plumbing::watch::cache::{Health, Shared};
use groundskeeper_plumbing::{
    Readiness, metrics,
    serving::{self, admin},
};
use groundskeeper_sysctl_rules::args::PolicyArgs;
use groundskeeper_sysctl_rules::crd::Mode;
use testkit::hostile::{self, Attack, Tally, Target};
use tokio_util::sync::CancellationToken;

const CALLER: &str = "127.0.0.1";
const ATTACKER: &str = "127.0.0.2";

fn binding_review() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding", "operation": "CREATE", "userInfo": {"username": "system:kube-scheduler"}, "namespace": "ns",
            "object": {"metadata": {"name": "p"}, "target": {"name": "n1"}}},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_reviews_answered_under_500_silent_connections_and_slowloris() {
    let files = hostile::raise_open_files(8192);
    assert!(
        files >= 4096,
        "open files limit {files}: too low for 500 connections a port"
    );
    let token = CancellationToken::new();
    let hosts = vec!["127.0.0.1".to_string()];
    let (cert, key) = serving::self_signed::issue(&hosts, time::OffsetDateTime::now_utc()).unwrap();
    let certs = Arc::new(serving::Certificates::default());
    certs.load(cert.as_bytes(), key.as_bytes()).unwrap();
    let tls = serving::server_config(certs).unwrap();

    let readiness = Readiness::default();
    readiness.register("pods").mark_ready();
    let (admin_addr, admin_serve) = admin::bind(
        "127.0.0.1:0".parse().unwrap(),
        metrics::registry(),
        readiness,
        None,
        Some(tls.clone()),
        token.clone(),
    )
    .await
    .unwrap();
    tokio::spawn(admin_serve);

    let registry = prometheus::Registry::new();
    let m = Metrics::register(&registry).unwrap();
    let mock = testkit::api::Mock::answering(&[]);
    let reviewer = Arc::new(serve::Reviewer {
        args: PolicyArgs {
            allowed_unsafe_sysctls: vec![],
            sysctl_default_mode: Mode::Enforce,
        },
        dry_run: false,
        cache: Shared::default(),
        health: Health::new([]),
        lookups: serve::Lookups {
            client: mock.client(),
            budget: Budget::new(0.0, 1),
        },
        metrics: m.clone(),
    });
    let limits = limits::limits();
    let app = serving::limited(serve::router(reviewer), &limits, m.counters());
    let (webhook_addr, webhook_serve) = serving::bind(
        "127.0.0.1:0".parse().unwrap(),
        "--webhook-addr",
        Some(tls),
        app,
        limits,
        m.counters(),
        token.clone(),
    )
    .await
    .unwrap();
    tokio::spawn(webhook_serve);
    let admin = Target::new(admin_addr, &cert);
    let webhook = Target::new(webhook_addr, &cert);

    // The attacker on a thread of its own, as another process would be.
    let attacker_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let tally = Arc::new(Tally::default());
    let attackers = {
        let _on = attacker_rt.enter();
        let from: IpAddr = ATTACKER.parse().unwrap();
        let pause = Duration::from_secs(1);
        let body = |len| Attack::SlowBody {
            path: "/validate/binding",
            len,
        };
        let t = || tally.clone();
        vec![
            hostile::attack(&admin, from, 500, Attack::Silent, pause, t()),
            hostile::attack(&webhook, from, 500, Attack::Silent, pause, t()),
            hostile::attack(&webhook, from, 20, Attack::SlowHeaders, pause, t()),
            hostile::attack(&webhook, from, 20, body(Some(1000)), pause, t()),
            hostile::attack(&webhook, from, 10, body(Some(1 << 20)), pause, t()),
            hostile::attack(&webhook, from, 10, body(None), pause, t()),
        ]
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let caller: IpAddr = CALLER.parse().unwrap();
    let for_ = Duration::from_secs(6);
    let (probes, reviews) = tokio::join!(
        hostile::every(
            &admin,
            caller,
            hostile::get("/readyz"),
            Duration::from_millis(100),
            for_
        ),
        hostile::every(
            &webhook,
            caller,
            hostile::post("/validate/binding", &binding_review()),
            Duration::from_millis(20),
            for_
        ),
    );
    drop(attackers);
    attacker_rt.shutdown_background();

    let p99 = |v: &[(Result<u16, String>, Duration)]| {
        hostile::percentile_ms(&v.iter().map(|p| p.1).collect::<Vec<_>>(), 99.0)
    };
    println!(
        "controller-manager under attack from {ATTACKER}: {} probes (p99 {:.1} ms), {} reviews (p99 {:.1} ms); attacker opened {}, closed {}",
        probes.len(),
        p99(&probes),
        reviews.len(),
        p99(&reviews),
        tally.opened(),
        tally.closed()
    );
    testkit::figures::bench("slow_clients_review_p99_ms", p99(&reviews), "ms");
    testkit::figures::bench("slow_clients_probe_p99_ms", p99(&probes), "ms");
    let text = metrics::render(&registry);
    for line in text.lines().filter(|l| {
        l.starts_with("groundskeeper_sysctl_webhook_refused_total") && !l.ends_with(" 0")
    }) {
        println!("  {line}");
    }
    assert!(tally.opened() >= 1000, "the attack ran: {}", tally.opened());
    assert!(
        probes.len() >= 20 && reviews.len() >= 50,
        "{} {}",
        probes.len(),
        reviews.len()
    );
    for (i, (r, took)) in probes.iter().enumerate() {
        assert_eq!(r, &Ok(200), "probe {i}");
        assert!(*took < Duration::from_secs(1), "probe {i} took {took:?}");
    }
    for (i, (r, _)) in reviews.iter().enumerate() {
        assert_eq!(r, &Ok(200), "review {i}");
    }
    token.cancel();
}
