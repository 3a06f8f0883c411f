//! Leader election against a real apiserver: one replica leads, a SIGKILLed leader is replaced
//! within lease duration + retry period, a SIGTERMed leader hands over at once, and two
//! replicas never lead at the same time.

use std::{net::SocketAddr, time::Duration};

use testkit::leases::{LEADER_GAUGE, election_args, holder, leads};
use testkit::{Binary, metric, wait_for};

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
