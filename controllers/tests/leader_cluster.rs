//! Leader election against a real apiserver: one replica leads, a SIGKILLed leader is replaced
//! within lease duration + retry period, a SIGTERMed leader hands over at once, two replicas
//! never lead at the same time, a standby whose Lease read is held (a frozen proxy) times
//! the lease from when the answer arrived, and each change of leader is a `LeaderElection`
//! Event on the Lease.

use std::{net::SocketAddr, time::Duration};

use k8s_openapi::api::{coordination::v1::Lease, events::v1::Event};
use kube::Api;

use testkit::leases::{LEADER_GAUGE, election_args, holder, leads};
use testkit::{Binary, metric, proxy::Proxy, wait_for};

struct Replica {
    name: &'static str,
    admin: SocketAddr,
    bin: Binary,
}

fn replica(name: &'static str, lease: &str, ns: &str) -> Replica {
    let (bin, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        &format!("controller-manager-{name}"),
        &election_args(lease, ns, name),
        &[],
    )
    .expect("start controller-manager");
    Replica { name, admin, bin }
}

/// Fails if both replicas report leading right now.
async fn never_both(a: &Replica, b: &Replica) -> anyhow::Result<()> {
    if leads(a.admin).await && leads(b.admin).await {
        anyhow::bail!("{} and {} both report leading", a.name, b.name);
    }
    Ok(())
}

#[tokio::test]
async fn sigkilled_leader_is_replaced_and_sigterm_hands_over() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("sigkilled_leader_is_replaced_and_sigterm_hands_over").await
    else {
        return Ok(());
    };
    let ns = c.namespace("leader").await?;
    let lease = testkit::unique_name("gk-leader");

    let a = replica("a", &lease, &ns);
    let b = replica("b", &lease, &ns);
    wait_for(Duration::from_secs(20), "a lease holder", || async {
        Ok(!holder(&c, &ns, &lease).await?.is_empty())
    })
    .await?;
    let first = holder(&c, &ns, &lease).await?;
    let (leader, follower) = if first.starts_with("a_") {
        (a, b)
    } else {
        (b, a)
    };
    assert!(
        first.starts_with(&format!("{}_", leader.name)),
        "holder {first}"
    );
    wait_for(
        Duration::from_secs(10),
        "the holder's gauge to say it leads",
        || async { Ok(leads(leader.admin).await) },
    )
    .await?;
    for _ in 0..10 {
        never_both(&leader, &follower).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !leads(follower.admin).await,
        "the follower must not lead while the lease is held"
    );

    // SIGKILL: no release, the follower must wait out the lease (15 s) and take over by 17 s.
    leader.bin.signal("KILL").await?;
    let took = wait_for(
        Duration::from_secs(25),
        "the follower to take the lease",
        || async {
            Ok(holder(&c, &ns, &lease)
                .await?
                .starts_with(&format!("{}_", follower.name)))
        },
    )
    .await?;
    println!("takeover after SIGKILL: {took:?}");
    assert!(took <= Duration::from_secs(17), "took {took:?}");
    wait_for(Duration::from_secs(5), "the new leader's gauge", || async {
        Ok(leads(follower.admin).await)
    })
    .await?;
    drop(leader);

    // SIGTERM: the leader releases the lease, so a fresh standby takes over within a retry
    // period or two instead of the lease duration, and the old leader exits 0.
    let mut standby = replica("c", &lease, &ns);
    wait_for(
        Duration::from_secs(10),
        "the standby's admin server",
        || async { Ok(metric(standby.admin, LEADER_GAUGE).await?.is_some()) },
    )
    .await?;
    assert!(!leads(standby.admin).await);
    let mut old = follower;
    old.bin.signal("TERM").await?;
    let code = old.bin.wait_exit(Duration::from_secs(25)).await?;
    assert_eq!(code, Some(0), "SIGTERM exits 0; log:\n{}", old.bin.logs());
    assert!(
        old.bin.logs().contains("released leadership"),
        "log:\n{}",
        old.bin.logs()
    );
    let took = wait_for(
        Duration::from_secs(8),
        "the standby to take the released lease",
        || async { Ok(holder(&c, &ns, &lease).await?.starts_with("c_")) },
    )
    .await?;
    println!("takeover after SIGTERM: {took:?}");
    standby.bin.signal("TERM").await?;
    assert_eq!(
        standby.bin.wait_exit(Duration::from_secs(25)).await?,
        Some(0)
    );
    Ok(())
}

/// Two leaders at once is the worst case, black-box: a standby whose GET of the Lease is held (its connection
/// frozen behind a proxy for 7 s, under the 10 s round deadline) while the leader renews and
/// then dies must take over no earlier than lease duration (15 s) after that GET was answered,
/// which is after the proxy resumed. Timed from when it asked, it took over about 8 s after the
/// answer: inside the dead leader's term, had it been merely partitioned.
#[tokio::test]
async fn a_standby_whose_lease_read_is_held_times_it_from_the_answer() -> anyhow::Result<()> {
    let test = "a_standby_whose_lease_read_is_held_times_it_from_the_answer";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let Some(apiserver) = testkit::proxy::apiserver_addr(&c.kubeconfig)? else {
        testkit::skipped(test, "the kubeconfig names the apiserver by host name");
        return Ok(());
    };
    let ns = c.namespace("leader-held").await?;
    let lease = testkit::unique_name("gk-held");
    let quiet = ["--controllers="];
    let start = |name: &str, env: &[(&str, &str)]| {
        let mut args = election_args(&lease, &ns, name).to_vec();
        args.extend_from_slice(&quiet);
        Binary::start_with_admin(
            env!("CARGO_BIN_EXE_controller-manager"),
            &format!("controller-manager-{name}"),
            &args,
            env,
        )
    };
    let (leader, _) = start("held-a", &[])?;
    wait_for(Duration::from_secs(20), "A to take the lease", || async {
        Ok(holder(&c, &ns, &lease).await?.starts_with("held-a_"))
    })
    .await?;
    // B talks to the apiserver only through the proxy.
    let proxy = Proxy::start(apiserver).await?;
    let via_proxy = testkit::proxy::kubeconfig_with_server(&c.kubeconfig, &proxy.url())?;
    let via_proxy = via_proxy.display().to_string();
    let (standby, b_admin) = start("held-b", &[("KUBECONFIG", via_proxy.as_str())])?;
    wait_for(Duration::from_secs(20), "B's admin server", || async {
        Ok(metric(b_admin, LEADER_GAUGE).await?.is_some())
    })
    .await?;
    // B is following (it reads the Lease every second) when its connection freezes: its next
    // read is held. A keeps renewing for 6 s, then is killed (no release); 1 s later the proxy
    // resumes and B's read is answered with A's last renewal.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!leads(b_admin).await, "B must be a standby");
    proxy.freeze();
    tokio::time::sleep(Duration::from_secs(6)).await;
    leader.signal("KILL").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.resume();
    let resumed = std::time::Instant::now();
    let took = wait_for(Duration::from_secs(30), "B to take the lease", || async {
        Ok(holder(&c, &ns, &lease).await?.starts_with("held-b_"))
    })
    .await?;
    let since_answer = resumed.elapsed();
    println!(
        "B took the lease {since_answer:?} after its held read was let through ({took:?} of waiting)"
    );
    assert!(
        since_answer >= Duration::from_secs(15),
        "B took over {since_answer:?} after the answer to its held read (lease duration 15 s); log:\n{}",
        standby.logs()
    );
    drop(standby);
    Ok(())
}

/// The `LeaderElection` Events regarding the Lease `ns/lease`, as `(note, reporting instance)`.
async fn leader_events(
    c: &testkit::Cluster,
    ns: &str,
    lease: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let api: Api<Event> = Api::namespaced(c.client.clone(), ns);
    let lease_uid = Api::<Lease>::namespaced(c.client.clone(), ns)
        .get(lease)
        .await?
        .metadata
        .uid;
    let mut found = Vec::new();
    for e in api.list(&Default::default()).await?.items {
        if e.reason.as_deref() != Some("LeaderElection") {
            continue;
        }
        let r = e.regarding.clone().unwrap_or_default();
        assert_eq!(
            (r.kind.as_deref(), r.api_version.as_deref()),
            (Some("Lease"), Some("coordination.k8s.io/v1")),
            "{e:?}"
        );
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_deref()),
            (Some(ns), Some(lease)),
            "{e:?}"
        );
        assert_eq!(r.uid, lease_uid, "{e:?}");
        assert_eq!(e.type_.as_deref(), Some("Normal"), "{e:?}");
        assert_eq!(
            e.reporting_controller.as_deref(),
            Some("groundskeeper.dev/controller-manager"),
            "{e:?}"
        );
        found.push((
            e.note.unwrap_or_default(),
            e.reporting_instance.unwrap_or_default(),
        ));
    }
    found.sort();
    Ok(found)
}

/// client-go's `LeaderElection` Events: once a replica acquires the Lease, exactly one Event
/// `<identity> became leader` regards it (renewals add none); when it hands over on SIGTERM,
/// `<identity> stopped leading`, and the new leader's own `became leader`.
#[tokio::test]
async fn each_change_of_leader_is_an_event_on_the_lease() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("each_change_of_leader_is_an_event_on_the_lease").await else {
        return Ok(());
    };
    let ns = c.namespace("leader-events").await?;
    let lease = testkit::unique_name("gk-events");
    let start = |name: &str| {
        let mut args = election_args(&lease, &ns, name).to_vec();
        args.push("--controllers=");
        let pod = format!("controller-manager-{name}");
        Binary::start_with_admin(
            env!("CARGO_BIN_EXE_controller-manager"),
            &pod,
            &args,
            &[("POD_NAME", pod.as_str())],
        )
    };
    let (first, _) = start("ev-a")?;
    wait_for(Duration::from_secs(20), "A to take the lease", || async {
        Ok(holder(&c, &ns, &lease).await?.starts_with("ev-a_"))
    })
    .await?;
    let a = holder(&c, &ns, &lease).await?;
    let became_a = (
        format!("{a} became leader"),
        "controller-manager-ev-a".to_string(),
    );
    wait_for(Duration::from_secs(10), "A's Event", || async {
        Ok(!leader_events(&c, &ns, &lease).await?.is_empty())
    })
    .await?;
    // A few renewals later, still the one Event.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        leader_events(&c, &ns, &lease).await?,
        vec![became_a.clone()],
        "log:\n{}",
        first.logs()
    );

    let (second, b_admin) = start("ev-b")?;
    wait_for(Duration::from_secs(20), "B's admin server", || async {
        Ok(testkit::metric(b_admin, LEADER_GAUGE).await?.is_some())
    })
    .await?;
    first.signal("TERM").await?;
    wait_for(Duration::from_secs(25), "B to take the lease", || async {
        Ok(holder(&c, &ns, &lease).await?.starts_with("ev-b_"))
    })
    .await?;
    let b = holder(&c, &ns, &lease).await?;
    let mut want = vec![
        became_a,
        (
            format!("{a} stopped leading"),
            "controller-manager-ev-a".to_string(),
        ),
        (
            format!("{b} became leader"),
            "controller-manager-ev-b".to_string(),
        ),
    ];
    want.sort();
    let got = wait_for(Duration::from_secs(10), "the handover's Events", || async {
        Ok(leader_events(&c, &ns, &lease).await? == want)
    })
    .await;
    let events = leader_events(&c, &ns, &lease).await?;
    assert!(
        got.is_ok(),
        "{events:?}\nwant {want:?}\nA's log:\n{}\nB's log:\n{}",
        first.logs(),
        second.logs()
    );
    drop(second);
    Ok(())
}
