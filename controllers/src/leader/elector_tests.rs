//! The elector against an in-memory Lease endpoint that can be made to hang: leadership ends at
//! the term's instant whatever the requests are doing.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use http::Request;
use kube::client::Body;
use serde_json::{Value, json};

use super::*;

const NS: &str = "ns";
const NAME: &str = "lease";

/// One Lease, with resourceVersion checks on replace, and switches that make reads or writes
/// hang (a frozen connection).
#[derive(Clone, Default)]
struct LeaseServer {
    lease: Arc<Mutex<Option<Value>>>,
    hang_reads: Arc<AtomicBool>,
    hang_writes: Arc<AtomicBool>,
    /// Reads are answered this long after they arrive, with the Lease as it is then (an
    /// overloaded apiserver).
    read_delay: Arc<Mutex<Duration>>,
    /// When each read arrived.
    reads: Arc<Mutex<Vec<Instant>>>,
    /// When each write was stored, and the holder it wrote.
    writes: Arc<Mutex<Vec<(Instant, String)>>>,
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": reason,
        "reason": reason, "code": code})
}

impl LeaseServer {
    fn client(&self) -> kube::Client {
        let s = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let s = s.clone();
            async move {
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await.unwrap();
                let write = parts.method != http::Method::GET;
                let hang = if write { &s.hang_writes } else { &s.hang_reads };
                if hang.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                if !write {
                    s.reads.lock().unwrap().push(Instant::now());
                    let delay = *s.read_delay.lock().unwrap();
                    tokio::time::sleep(delay).await;
                }
                let (code, body) = s.answer(parts.method.as_str(), &bytes);
                Ok::<_, std::convert::Infallible>(testkit::api::reply(code, &body))
            }
        });
        kube::Client::new(svc, NS)
    }

    fn answer(&self, method: &str, body: &[u8]) -> (u16, Value) {
        let mut stored = self.lease.lock().unwrap();
        let rv = |v: &Value| {
            v["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_string)
        };
        match method {
            "GET" => match &*stored {
                Some(l) => (200, l.clone()),
                None => (404, status(404, "NotFound")),
            },
            "POST" | "PUT" => {
                let mut new: Value = serde_json::from_slice(body).unwrap();
                let next = match &*stored {
                    None if method == "POST" => 1,
                    Some(old) if method == "PUT" && rv(old) == rv(&new) => {
                        rv(old).unwrap().parse::<u64>().unwrap() + 1
                    }
                    _ => return (409, status(409, "Conflict")),
                };
                new["metadata"]["resourceVersion"] = json!(next.to_string());
                new["metadata"]["uid"] = json!("lease-uid");
                new["apiVersion"] = json!("coordination.k8s.io/v1");
                new["kind"] = json!("Lease");
                let holder = new["spec"]["holderIdentity"].as_str().unwrap_or_default();
                self.writes
                    .lock()
                    .unwrap()
                    .push((Instant::now(), holder.to_string()));
                *stored = Some(new.clone());
                (if method == "POST" { 201 } else { 200 }, new)
            }
            _ => (405, status(405, "MethodNotAllowed")),
        }
    }

    fn holder(&self) -> String {
        let l = self.lease.lock().unwrap();
        l.as_ref()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

fn config() -> ElectionConfig {
    ElectionConfig {
        lease_name: NAME.into(),
        namespace: NS.into(),
        identity: "me_1".into(),
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    }
}

fn gauge() -> LeaderMetrics {
    LeaderMetrics::register(&prometheus::Registry::new(), NAME).unwrap()
}

/// Starts an elector, waits until it leads and has renewed a few times.
async fn leading(
    server: &LeaseServer,
) -> (
    tokio::task::JoinHandle<Result<(), LeaderError>>,
    Leadership,
    LeaderMetrics,
) {
    let g = gauge();
    let (elector, leadership) = Elector::new(server.client(), config(), g.clone());
    let task = tokio::spawn(elector.run(CancellationToken::new()));
    leadership.acquired().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(leadership.is_leading());
    assert_eq!(server.holder(), "me_1");
    (task, leadership, g)
}

fn term_end(l: &Leadership) -> Instant {
    match l.fence().term() {
        Term::Until(end) => end.at,
        t => panic!("not leading: {t:?}"),
    }
}

/// A hung write (or read) must not extend leadership: the elector gives up, and the fence
/// closes, exactly at last renewal + renew deadline, not when the request times out.
#[tokio::test(start_paused = true)]
async fn hung_lease_calls_end_leadership_at_the_term() {
    for hang_reads in [false, true] {
        let server = LeaseServer::default();
        let (task, leadership, g) = leading(&server).await;
        let frozen_at = Instant::now();
        if hang_reads {
            server.hang_reads.store(true, Ordering::SeqCst);
        }
        server.hang_writes.store(true, Ordering::SeqCst);
        let end = term_end(&leadership);
        assert!(end > frozen_at && end - frozen_at <= Duration::from_secs(10));

        let fence = leadership.fence();
        let write = fence.guard(tokio::time::sleep(Duration::from_secs(3600)));
        assert_eq!(write.await, Err(Fenced), "in-flight write dropped");
        assert_eq!(
            Instant::now(),
            end,
            "fence closed at the term, hang_reads={hang_reads}"
        );

        let res = task.await.unwrap();
        assert!(
            matches!(res, Err(LeaderError::RenewDeadline { .. })),
            "{res:?}"
        );
        assert_eq!(Instant::now(), end, "elector gave up at the term");
        assert!(!leadership.is_leading());
        assert_eq!(leadership.fence().term(), Term::Standby);
        assert_eq!(g.value(), 0);
    }
}

/// Each renewal moves the term to (its start + renew deadline): with renewals every retry
/// period the term is always between 8 s and 10 s ahead.
#[tokio::test(start_paused = true)]
async fn renewals_keep_the_term_ahead() {
    let server = LeaseServer::default();
    let (task, leadership, g) = leading(&server).await;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let ahead = term_end(&leadership) - Instant::now();
        assert!(
            ahead > Duration::from_secs(7) && ahead <= Duration::from_secs(10),
            "{ahead:?}"
        );
        assert_eq!(g.value(), 1);
    }
    task.abort();
}

/// Another replica took the lease (say we were paused): stop acting at the next read.
#[tokio::test(start_paused = true)]
async fn a_lease_taken_over_ends_leadership() {
    let server = LeaseServer::default();
    let (task, leadership, _g) = leading(&server).await;
    {
        let mut l = server.lease.lock().unwrap();
        let l = l.as_mut().unwrap();
        l["spec"]["holderIdentity"] = json!("other_2");
        l["spec"]["renewTime"] = json!("2030-01-01T00:00:00.000000Z");
    }
    let res = task.await.unwrap();
    assert!(
        matches!(res, Err(LeaderError::TakenOver { ref holder, .. }) if holder == "other_2"),
        "{res:?}"
    );
    assert!(!leadership.is_leading());
    assert_eq!(
        server.holder(),
        "other_2",
        "the new holder's lease is left alone"
    );
}

/// A candidate whose requests hang never leads, and its round is bounded.
#[tokio::test(start_paused = true)]
async fn a_hung_candidate_never_leads() {
    let server = LeaseServer::default();
    server.hang_writes.store(true, Ordering::SeqCst);
    let (elector, leadership) = Elector::new(server.client(), config(), gauge());
    let task = tokio::spawn(elector.run(CancellationToken::new()));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!leadership.is_leading());
    assert_eq!(leadership.fence().term(), Term::Standby);
    assert!(!task.is_finished(), "a candidate keeps campaigning");
    task.abort();
}

/// An elector that leads, with the token that stops it.
async fn leading_until_cancelled() -> (
    LeaseServer,
    tokio::task::JoinHandle<Result<(), LeaderError>>,
    Leadership,
    LeaderMetrics,
    CancellationToken,
) {
    let server = LeaseServer::default();
    let g = gauge();
    let (elector, leadership) = Elector::new(server.client(), config(), g.clone());
    let token = CancellationToken::new();
    let task = tokio::spawn(elector.run(token.clone()));
    leadership.acquired().await;
    (server, task, leadership, g, token)
}

/// SIGTERM during a hung round: the elector stops at once (the release it then tries is bounded
/// by the renew deadline), and stops acting before it returns.
#[tokio::test(start_paused = true)]
async fn shutdown_does_not_wait_for_a_hung_round() {
    let (server, task, leadership, g, token) = leading_until_cancelled().await;
    server.hang_reads.store(true, Ordering::SeqCst);
    server.hang_writes.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = Instant::now();
    token.cancel();
    assert!(task.await.unwrap().is_ok());
    assert!(t.elapsed() <= Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(leadership.fence().term(), Term::Standby);
    assert_eq!(g.value(), 0);
}

/// On SIGTERM the fence closes, and the leader gauge drops, before the Lease is freed: while the
/// release is on its way (here: held), nothing of this replica may pass and it must not count
/// as a leader, since another replica can take the Lease the moment the release lands.
#[tokio::test(start_paused = true)]
async fn shutdown_stops_acting_before_it_releases_the_lease() {
    let (server, task, leadership, g, token) = leading_until_cancelled().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(g.value(), 1);
    server.hang_writes.store(true, Ordering::SeqCst);
    token.cancel();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !task.is_finished(),
        "the release is held, the elector waits for it"
    );
    assert_eq!(leadership.fence().term(), Term::Standby);
    assert_eq!(g.value(), 0);
    assert_eq!(server.holder(), "me_1", "the Lease is not freed yet");
    assert!(task.await.unwrap().is_ok());
}

/// Another replica's renewal, as the apiserver stores it.
fn renew_as(server: &LeaseServer, holder: &str, renew_time: &str) {
    let mut l = server.lease.lock().unwrap();
    let rv = l.as_ref().map_or(0, |l| {
        l["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    });
    *l = Some(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": NAME, "namespace": NS, "resourceVersion": (rv + 1).to_string()},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "renewTime": renew_time, "leaseTransitions": 0},
    }));
}

/// A standby whose GET is held for seconds (an overloaded apiserver) while the holder renews
/// one last time and then dies: the standby times the lease from when the answer arrived, so it
/// takes over no earlier than lease duration after that answer, and so after the holder's term
/// (its renew deadline, 10 s) is over. Timed from when it asked, it took over 9 s after the
/// holder's last renewal: while the holder still led.
#[tokio::test(start_paused = true)]
async fn a_standby_times_the_lease_from_the_answer_not_the_question() {
    let lease = Duration::from_secs(15);
    let hold = Duration::from_secs(7);
    let server = LeaseServer::default();
    renew_as(&server, "other_2", "2026-01-01T00:00:00.000000Z");
    let (elector, leadership) = Elector::new(server.client(), config(), gauge());
    let task = tokio::spawn(elector.run(CancellationToken::new()));
    // The standby follows a live holder for a while (the holder renews every 2 s).
    for i in 1..=5 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        renew_as(
            &server,
            "other_2",
            &format!("2026-01-01T00:00:{:02}.000000Z", 2 * i),
        );
    }
    assert!(!leadership.is_leading());
    // The standby's next read is held 7 s (the reads after it are not). While it is held, the
    // holder renews a last time (6 s into the hold), then dies.
    *server.read_delay.lock().unwrap() = hold;
    let asked = server.reads.lock().unwrap().len();
    let read_at = loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if let Some(t) = server.reads.lock().unwrap().get(asked) {
            break *t;
        }
    };
    *server.read_delay.lock().unwrap() = Duration::ZERO;
    tokio::time::sleep_until(read_at + Duration::from_secs(6)).await;
    renew_as(&server, "other_2", "2026-01-01T00:01:00.000000Z");
    let last_renewal = Instant::now();
    let answered = read_at + hold;

    leadership.acquired().await;
    let acquired = server
        .writes
        .lock()
        .unwrap()
        .iter()
        .find(|(_, h)| h == "me_1")
        .map(|(t, _)| *t)
        .expect("the standby wrote the lease");
    assert!(
        acquired >= answered + lease,
        "took over {:?} after the answer that showed the last renewal (lease duration {lease:?})",
        acquired - answered
    );
    assert!(
        acquired >= last_renewal + lease,
        "took over {:?} after the holder's last renewal",
        acquired - last_renewal
    );
    task.abort();
}

/// The lease duration written for standbys to wait is rounded up: 10.5 s rounded down to 10 s
/// would leave a standby 0.5 s less than the leader's term needs.
#[tokio::test(start_paused = true)]
async fn the_lease_duration_written_is_rounded_up() {
    for (flag, want) in [
        (Duration::from_secs(15), 15),
        (Duration::from_millis(10_500), 11),
        (Duration::from_millis(10_001), 11),
        (Duration::from_millis(500), 1),
    ] {
        assert_eq!(lease_duration_seconds(flag), want, "{flag:?}");
    }
    let server = LeaseServer::default();
    let cfg = ElectionConfig {
        lease_duration: Duration::from_millis(10_500),
        renew_deadline: Duration::from_millis(9_500),
        ..config()
    };
    let (elector, leadership) = Elector::new(server.client(), cfg, gauge());
    let task = tokio::spawn(elector.run(CancellationToken::new()));
    leadership.acquired().await;
    let written =
        server.lease.lock().unwrap().as_ref().unwrap()["spec"]["leaseDurationSeconds"].clone();
    assert_eq!(written, json!(11));
    task.abort();
}

/// client-go's `LeaderElection` Events on the Lease (kind, apiVersion, namespace, name, uid):
/// one `<identity> became leader` when it acquires, none for its renewals, and one
/// `<identity> stopped leading` when it releases the Lease on shutdown. A leader whose Lease
/// was taken over writes nothing more: the new leader's Event tells it.
#[tokio::test(start_paused = true)]
async fn leadership_changes_are_recorded_as_events_on_the_lease() {
    use groundskeeper_plumbing::events::{Recording, Sink};
    for taken_over in [false, true] {
        let server = LeaseServer::default();
        let recording = Arc::new(Recording::default());
        let sink: Arc<dyn Sink> = recording.clone();
        let (elector, leadership) = Elector::new(server.client(), config(), gauge());
        let elector = elector.recording(Events::to(sink, events::reporter(), false));
        let token = CancellationToken::new();
        let task = tokio::spawn(elector.run(token.clone()));
        leadership.acquired().await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let notes = |written: &[k8s_openapi::api::events::v1::Event]| {
            written
                .iter()
                .map(|e| e.note.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        let written = recording.take();
        assert_eq!(notes(&written), ["me_1 became leader"]);
        let e = &written[0];
        assert_eq!(e.reason.as_deref(), Some("LeaderElection"));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(
            e.reporting_controller.as_deref(),
            Some("groundskeeper.dev/controller-manager")
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some(NS));
        let r = e.regarding.clone().unwrap();
        assert_eq!(
            (r.kind.as_deref(), r.api_version.as_deref()),
            (Some("Lease"), Some("coordination.k8s.io/v1"))
        );
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_deref(), r.uid.as_deref()),
            (Some(NS), Some(NAME), Some("lease-uid"))
        );
        if taken_over {
            let mut l = server.lease.lock().unwrap();
            let l = l.as_mut().unwrap();
            l["spec"]["holderIdentity"] = json!("other_2");
            l["spec"]["renewTime"] = json!("2030-01-01T00:00:00.000000Z");
        } else {
            token.cancel();
        }
        let res = task.await.unwrap();
        assert_eq!(res.is_err(), taken_over, "{res:?}");
        let written = recording.take();
        if taken_over {
            assert_eq!(notes(&written), Vec::<String>::new());
            continue;
        }
        assert_eq!(notes(&written), ["me_1 stopped leading"]);
        assert_eq!(written[0].reason.as_deref(), Some("LeaderElection"));
        assert_eq!(server.holder(), "", "released after the Event");
    }
}
