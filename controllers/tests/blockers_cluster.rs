//! `controller-manager servicecidr blockers NAME` against a real apiserver: every blocking
//! IPAddress (more than the Event's 10) with its owner, exit 0 (1 with `--exit-code`); nothing
//! blocking once another ServiceCIDR covers it, exit 0; a ServiceCIDR that does not exist, exit 2.

use testkit::{
    Cluster,
    networking::{LABEL_FAMILY, LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR, ip_address, service_cidr},
    unique_name,
};

const BIN: &str = env!("CARGO_BIN_EXE_controller-manager");

/// A second octet of our own, so leftovers of other runs and tests do not overlap.
fn octet() -> u8 {
    (std::process::id() % 200) as u8 + 30
}

async fn cidr(c: &Cluster, name: &str, cidr: &str) -> anyhow::Result<()> {
    c.create(&service_cidr(name, [cidr])).await?;
    Ok(())
}

async fn ip(c: &Cluster, ip: &str, managed: bool, service: &str) -> anyhow::Result<()> {
    let family = (LABEL_FAMILY, "IPv4");
    let labels: &[(&str, &str)] = if managed {
        &[family, (LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR)]
    } else {
        &[family]
    };
    c.create(&ip_address(ip, labels, "team-a", service)).await?;
    Ok(())
}

async fn blockers(c: &Cluster, name: &str) -> anyhow::Result<(i32, String, String)> {
    blockers_with(c, name, &[]).await
}

async fn blockers_with(
    c: &Cluster,
    name: &str,
    flags: &[&str],
) -> anyhow::Result<(i32, String, String)> {
    let out = tokio::process::Command::new(BIN)
        .args(["servicecidr", "blockers", name])
        .args(flags)
        .env("KUBECONFIG", &c.kubeconfig)
        .output()
        .await?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

#[tokio::test]
async fn blockers_lists_every_blocking_ip_and_exits_by_outcome() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("blockers_lists_every_blocking_ip_and_exits_by_outcome").await
    else {
        return Ok(());
    };
    let o = octet();
    let name = unique_name("gk-blockers");
    cidr(&c, &name, &format!("10.206.{o}.0/24")).await?;
    for i in 1..=12 {
        ip(&c, &format!("10.206.{o}.{i}"), true, &format!("web-{i}")).await?;
    }
    // Neither an unmanaged IP nor the network address blocks.
    ip(&c, &format!("10.206.{o}.100"), false, "manual").await?;
    ip(&c, &format!("10.206.{o}.0"), true, "network").await?;

    // A report of blockers is a successful answer; --exit-code makes it 1 for scripts.
    let (code, out, err) = blockers(&c, &name).await?;
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let (code, scripted, err) = blockers_with(&c, &name, &["--exit-code"]).await?;
    assert_eq!(code, 1, "stdout: {scripted}\nstderr: {err}");
    assert_eq!(scripted, out);
    assert!(out.contains("12 IPAddress(es)"), "{out}");
    for i in 1..=12 {
        let line = format!("10.206.{o}.{i}\tservices team-a/web-{i}");
        assert!(out.contains(&line), "{line} missing from:\n{out}");
    }
    assert!(!out.contains(&format!("10.206.{o}.100")), "{out}");
    assert!(!out.contains("network"), "{out}");

    // A covering ServiceCIDR: nothing blocks any more.
    let parent = unique_name("gk-blockers-parent");
    cidr(&c, &parent, "10.206.0.0/16").await?;
    let (code, out, err) = blockers_with(&c, &name, &["--exit-code"]).await?;
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("nothing blocks"), "{out}");

    let (code, out, err) = blockers(&c, "gk-no-such-servicecidr").await?;
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(err.contains("no ServiceCIDR named"), "{err}");
    Ok(())
}
