//! Fencing against a real apiserver: a leader that can not reach the apiserver (partitioned
//! behind a frozen proxy), or that is stopped (SIGSTOP) and wakes after a standby took over,
//! never writes after the standby acquired the lease, and stops acting within the renew
//! deadline of its last successful renewal.
//!
//! Both replicas run PodGC while orphaned pods (bound to a node that does not exist) keep
//! appearing, so either always has a destructive write to make. Writes are attributed through
//! the apiserver's audit log (user agent `controller-manager/<v> (<POD_NAME>…)`), so these tests
//! need the throwaway control plane (`KUBE_APISERVER`); with `KUBECONFIG` they are skipped.
//!
//! `GK_FENCING_RUNS=<n>` repeats each scenario n times (default 1) and prints the figures.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams};
use testkit::leases::{LEADER_GAUGE, election_args, holder, leads};
use testkit::{Binary, Cluster, audit, metric, proxy::Proxy, unique_name, wait_for};

const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// The scenarios share the control plane (and PodGC is cluster-wide): one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs with POD_NAME = its name: the leader identity prefix and the user agent's instance.
struct Replica {
    admin: SocketAddr,
    bin: Binary,
}

fn replica(
    name: &str,
    lease: &str,
    ns: &str,
    kubeconfig: Option<&Path>,
    extra: &[&str],
) -> Replica {
    let mut env = vec![("POD_NAME", name.to_string())];
    if let Some(k) = kubeconfig {
        env.push(("KUBECONFIG", k.display().to_string()));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut args = election_args(lease, ns, name).to_vec();
    args.extend_from_slice(&[
        "--controllers",
        "podgc",
        "--gc-period",
        "300ms",
        "--orphan-quarantine",
        "0s",
    ]);
    args.extend_from_slice(extra);
    let (bin, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        &format!("controller-manager-{name}"),
        &args,
        &env,
    )
    .expect("start controller-manager");
    Replica { admin, bin }
}

/// Creates a pod bound to `node` (which does not exist) every 100 ms until aborted.
fn feed_orphans(c: &Cluster, ns: &str, node: &str) -> tokio::task::JoinHandle<()> {
    let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    let (ns, node) = (ns.to_string(), node.to_string());
    tokio::spawn(async move {
        loop {
            let pod = testkit::bound_pod(&ns, &unique_name("orphan"), &node);
            let _ = api.create(&PostParams::default(), &pod).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

fn by(e: &audit::Event, name: &str) -> bool {
    e.user_agent.contains(&format!("({name}"))
}

fn is_lease(e: &audit::Event) -> bool {
    e.object_ref.resource == "leases"
}

fn is_pod_write(e: &audit::Event) -> bool {
    e.object_ref.resource == "pods" && matches!(e.verb.as_str(), "delete" | "patch")
}

/// What the audit log says about one takeover.
#[derive(Debug)]
struct Figures {
    /// Received time of the standby's first successful lease write (its acquisition).
    acquired: Timestamp,
    /// The old leader's last successful renewal (received time).
    last_renewal: Timestamp,
    /// The old leader's last write of any kind (completion time), and its last pod write.
    last_write: Timestamp,
    last_pod_write: Option<Timestamp>,
    /// Writes by the old leader completed after the standby's acquisition arrived.
    late_writes: Vec<String>,
    /// Pod writes by the old leader, and by the new one after acquiring.
    old_pod_writes: usize,
    new_pod_writes: usize,
}

impl Figures {
    /// How far the old leader's writes reached into the new leader's term (0 if not at all).
    fn overlap(&self) -> Duration {
        let d = self.last_write.duration_since(self.acquired);
        if d.is_positive() {
            d.unsigned_abs()
        } else {
            Duration::ZERO
        }
    }

    /// Last pod write of the old leader after its last successful renewal.
    fn acted_after_renewal(&self) -> Option<SignedDuration> {
        self.last_pod_write
            .map(|t| t.duration_since(self.last_renewal))
    }
}

fn figures(log: &Path, old: &str, new: &str, after: Timestamp) -> anyhow::Result<Figures> {
    let events = audit::read(log)?;
    let writes: Vec<&audit::Event> = events.iter().filter(|e| e.is_write()).collect();
    let acquired = writes
        .iter()
        .filter(|e| {
            by(e, new) && is_lease(e) && e.succeeded() && e.request_received_timestamp > after
        })
        .map(|e| e.request_received_timestamp)
        .min()
        .ok_or_else(|| anyhow::anyhow!("no lease write by {new} in {}", log.display()))?;
    let old_writes: Vec<&&audit::Event> = writes.iter().filter(|e| by(e, old)).collect();
    let last_renewal = old_writes
        .iter()
        .filter(|e| is_lease(e) && e.succeeded())
        .map(|e| e.request_received_timestamp)
        .max()
        .ok_or_else(|| anyhow::anyhow!("{old} never wrote its lease"))?;
    let last_write = old_writes
        .iter()
        .map(|e| e.stage_timestamp)
        .max()
        .expect("it wrote its lease");
    let old_pods: Vec<&&&audit::Event> = old_writes.iter().filter(|e| is_pod_write(e)).collect();
    let late_writes = old_writes
        .iter()
        .filter(|e| e.stage_timestamp >= acquired)
        .map(|e| {
            format!(
                "{} {}/{} {} received {} answered {} ({})",
                e.verb,
                e.object_ref.resource,
                e.object_ref.name,
                e.object_ref.subresource,
                e.request_received_timestamp,
                e.stage_timestamp,
                e.code()
            )
        })
        .collect();
    Ok(Figures {
        acquired,
        last_renewal,
        last_write,
        last_pod_write: old_pods.iter().map(|e| e.request_received_timestamp).max(),
        late_writes,
        old_pod_writes: old_pods.len(),
        new_pod_writes: writes
            .iter()
            .filter(|e| by(e, new) && is_pod_write(e) && e.request_received_timestamp >= acquired)
            .count(),
    })
}

/// `since_last_renewal_ms` from the old leader's "stopped acting" line.
fn stopped_after(logs: &str) -> Option<Duration> {
    let line = logs.lines().find(|l| l.contains("stopped acting"))?;
    let v = line.split("since_last_renewal_ms=").nth(1)?;
    let ms: u64 = v
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms))
}

/// The timestamp of the first log line containing `needle`.
fn log_time(logs: &str, needle: &str) -> anyhow::Result<Timestamp> {
    let line = logs
        .lines()
        .find(|l| l.contains(needle))
        .ok_or_else(|| anyhow::anyhow!("no log line with {needle:?}:\n{logs}"))?;
    klog_time(line).ok_or_else(|| anyhow::anyhow!("no klog header on {line:?}"))
}

/// The time of a line in klog's text format (`I1127 20:52:17.695837 ...`, UTC, no year: this
/// year's, or last year's for a line from December read in January).
fn klog_time(line: &str) -> Option<Timestamp> {
    let mut words = line.split_whitespace();
    let (date, time) = (words.next()?, words.next()?);
    let (month, day) = (date.get(1..3)?, date.get(3..5)?);
    let now = Timestamp::now();
    let year = now.to_zoned(jiff::tz::TimeZone::UTC).year();
    let at = |y: i16| -> Option<Timestamp> { format!("{y}-{month}-{day}T{time}Z").parse().ok() };
    let t = at(year)?;
    if t > now + SignedDuration::from_hours(24) {
        at(year - 1)
    } else {
        Some(t)
    }
}

fn runs() -> usize {
    std::env::var("GK_FENCING_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// A's connection to the apiserver goes through a proxy that is frozen.
    Partition,
    /// Only A's lease connection goes through the proxy: A can not renew, but its
    /// controllers' writes still reach the apiserver. Only the fence stops them.
    LeasePartition,
    /// A is SIGSTOPped, and SIGCONTed after the standby took over.
    Stop,
}

/// One takeover under `fault`; returns (overlap, takeover time from the fault, figures).
async fn scenario(
    c: &Cluster,
    audit_log: &Path,
    apiserver: SocketAddr,
    fault: Fault,
) -> anyhow::Result<(Duration, Duration, Figures)> {
    let ns = c.namespace("fence").await?;
    let lease = unique_name("gk-fence");
    let node = unique_name("gone-node");
    let (a_name, b_name) = (unique_name("fence-a"), unique_name("fence-b"));

    let proxy = Proxy::start(apiserver).await?;
    let via_proxy: Option<PathBuf> = match fault {
        Fault::Partition | Fault::LeasePartition => Some(testkit::proxy::kubeconfig_with_server(
            &c.kubeconfig,
            &proxy.url(),
        )?),
        Fault::Stop => None,
    };
    let (a_kubeconfig, lease_kubeconfig) = match fault {
        Fault::LeasePartition => (None, via_proxy.map(|p| p.display().to_string())),
        _ => (via_proxy, None),
    };
    let mut a_args = vec![
        "--kube-api-qps",
        "2",
        "--kube-api-burst",
        "1",
        "--gc-concurrency",
        "32",
    ];
    if let Some(k) = &lease_kubeconfig {
        a_args.extend(["--leader-elect-kubeconfig", k.as_str()]);
    }
    // A's API budget is far below the work it has (about one pod per second, with orphans
    // appearing ten times faster): its deletions always queue for tokens. Its renewals must not
    // (they have their own client), and the queued deletions must not go out once it is fenced.
    let mut a = replica(&a_name, &lease, &ns, a_kubeconfig.as_deref(), &a_args);
    wait_for(Duration::from_secs(30), "A to take the lease", || async {
        Ok(holder(c, &ns, &lease)
            .await?
            .starts_with(&format!("{a_name}_")))
    })
    .await?;
    let b = replica(&b_name, &lease, &ns, None, &[]);
    wait_for(Duration::from_secs(20), "B's admin server", || async {
        Ok(metric(b.admin, LEADER_GAUGE).await?.is_some())
    })
    .await?;
    assert!(leads(a.admin).await && !leads(b.admin).await);

    // Work for whoever leads; wait until A has been deleting for longer than a renew deadline
    // with its budget exhausted, and still leads.
    let feeder = feed_orphans(c, &ns, &node);
    let busy = Instant::now();
    wait_for(Duration::from_secs(60), "A to delete orphans", || async {
        let n = audit::read(audit_log)?
            .iter()
            .filter(|e| by(e, &a_name) && is_pod_write(e) && e.succeeded())
            .count();
        Ok(n >= 5 && busy.elapsed() > RENEW_DEADLINE + Duration::from_secs(2))
    })
    .await?;
    assert!(
        leads(a.admin).await
            && holder(c, &ns, &lease)
                .await?
                .starts_with(&format!("{a_name}_")),
        "A kept its lease while its API budget was exhausted"
    );

    // At a random point of A's 2 s renewal cycle, not always at the same phase.
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos()
        % 2_000;
    tokio::time::sleep(Duration::from_millis(jitter.into())).await;
    let fault_at = Timestamp::now();
    let fault_instant = Instant::now();
    match fault {
        Fault::Partition | Fault::LeasePartition => proxy.freeze(),
        Fault::Stop => a.bin.signal("STOP").await?,
    }
    let took = wait_for(Duration::from_secs(40), "B to take the lease", || async {
        Ok(holder(c, &ns, &lease)
            .await?
            .starts_with(&format!("{b_name}_")))
    })
    .await?;
    // B must act; meanwhile a partitioned A has long given up, a stopped A is still stopped.
    wait_for(Duration::from_secs(20), "B to delete orphans", || async {
        let n = audit::read(audit_log)?
            .iter()
            .filter(|e| by(e, &b_name) && is_pod_write(e) && e.succeeded())
            .count();
        Ok(n >= 3)
    })
    .await?;
    if let Fault::Stop = fault {
        a.bin.signal("CONT").await?;
    }
    let code = a.bin.wait_exit(Duration::from_secs(30)).await?;
    // Let anything A might still send land (and B keep working) before reading the log.
    tokio::time::sleep(Duration::from_secs(2)).await;
    feeder.abort();
    let logs = a.bin.logs();
    assert_eq!(code, Some(1), "A exits non-zero after losing; log:\n{logs}");
    // Deletions that were queued (or in flight) when A lost its term, and were refused.
    let fenced = logs.matches("not leading any more: pod left alone").count();
    // From stopping to act to having stopped every controller: bounded (fenced work is dropped
    // at once; the drain is capped by --shutdown-grace, 10 s).
    let drained = log_time(&logs, "stopped all controllers")?
        .duration_since(log_time(&logs, "stopped acting")?);
    assert!(
        drained < SignedDuration::from_secs(10),
        "A drained for {drained:?}"
    );

    let f = figures(audit_log, &a_name, &b_name, fault_at)?;
    let stopped = stopped_after(&logs);
    println!(
        "{fault:?}: takeover {took:?} after the fault (lease changed hands {:?} after A's last renewal); \
         A stopped acting {stopped:?} after its last renewal (its log); A's last pod write {:?} after \
         its last renewal (audit); overlap {:?}; pod writes: A {} / B after acquiring {}; A's deletions fenced {fenced}, drained in {drained:?}; A's last \
         write {} vs B acquired {}; fault at {fault_at} ({:?} ago)",
        f.acquired.duration_since(f.last_renewal),
        f.acted_after_renewal(),
        f.overlap(),
        f.old_pod_writes,
        f.new_pod_writes,
        f.last_write,
        f.acquired,
        fault_instant.elapsed(),
    );
    assert!(
        f.late_writes.is_empty(),
        "A wrote after B acquired at {}:\n{}",
        f.acquired,
        f.late_writes.join("\n")
    );
    assert!(f.new_pod_writes > 0, "B acted after acquiring");
    // A's term is measured from before its renewal was sent, so its writes end within the
    // renew deadline of when the apiserver received that renewal.
    if let Some(d) = f.acted_after_renewal() {
        assert!(
            d <= SignedDuration::try_from(RENEW_DEADLINE)?,
            "A wrote pods {d:?} after its last renewal"
        );
    }
    match fault {
        Fault::Partition | Fault::LeasePartition => {
            // The elector gives up at its term: since_last_renewal ~ renew deadline (the start
            // of the round that succeeded), plus scheduling.
            let s = stopped.ok_or_else(|| anyhow::anyhow!("no 'stopped acting' line:\n{logs}"))?;
            assert!(
                s >= RENEW_DEADLINE && s <= RENEW_DEADLINE + Duration::from_millis(500),
                "A stopped {s:?} after its last renewal"
            );
        }
        // A stopped process gives up when it wakes, long past its term, without writing.
        Fault::Stop => assert!(
            logs.contains("stopped acting") || logs.contains("leadership lost"),
            "log:\n{logs}"
        ),
    }
    drop(proxy);
    drop(b);
    Ok((f.overlap(), took, f))
}

async fn repeat(test: &str, fault: Fault) -> anyhow::Result<()> {
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let Some(cp) = c.control_plane else {
        testkit::skipped(
            test,
            "needs the test control plane's audit log (KUBE_APISERVER, not KUBECONFIG)",
        );
        return Ok(());
    };
    let apiserver: SocketAddr = cp.url().trim_start_matches("https://").parse()?;
    let _serial = SERIAL.lock().await;
    let audit_log = Arc::new(cp.audit_log.clone());
    let mut table = Vec::new();
    for run in 1..=runs() {
        let (overlap, took, f) = scenario(&c, &audit_log, apiserver, fault).await?;
        table.push((overlap, took, f));
        println!("{fault:?} run {run}: ok");
    }
    println!("{fault:?} summary over {} runs:", table.len());
    for (i, (overlap, took, f)) in table.iter().enumerate() {
        println!(
            "  run {}: overlap {overlap:?}, takeover {took:?} after the fault, A's last pod write {:?} after its last renewal, margin (B acquired - A's last write) {:?}",
            i + 1,
            f.acted_after_renewal(),
            f.acquired.duration_since(f.last_write),
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_leader_stops_before_the_standby_takes_over() -> anyhow::Result<()> {
    repeat(
        "partitioned_leader_stops_before_the_standby_takes_over",
        Fault::Partition,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cut_off_from_its_lease_is_fenced_before_the_takeover() -> anyhow::Result<()> {
    repeat(
        "leader_cut_off_from_its_lease_is_fenced_before_the_takeover",
        Fault::LeasePartition,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_leader_wakes_fenced_after_the_takeover() -> anyhow::Result<()> {
    repeat(
        "stopped_leader_wakes_fenced_after_the_takeover",
        Fault::Stop,
    )
    .await
}
