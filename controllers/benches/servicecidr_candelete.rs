//! How long the deletion check (`canDeleteCIDR`) takes with 100k allocator-managed IPAddresses,
//! through the range index, next to upstream's list-and-scan for reference.
//!
//! cargo bench -p groundskeeper-controllers --bench servicecidr_candelete

use std::{hint::black_box, net::Ipv4Addr, time::Instant};

use groundskeeper_controllers::servicecidr::{
    decide::{CidrState, decide},
    index::{CidrSet, IpAddressFacts, IpIndex},
    prefix::Addr,
};

const IPS: u32 = 100_000;

fn cidrs(items: &[(&str, Vec<String>)]) -> CidrSet {
    let mut s = CidrSet::default();
    for (n, cs) in items {
        s.insert(n, cs);
    }
    s
}

/// 100k IPv4 addresses spread over 10.0.0.0/12 (every 8th from .1: never a /20's network or
/// broadcast address), plus 1k IPv6.
fn ips() -> (IpIndex, Vec<String>) {
    let mut ix = IpIndex::default();
    let mut names = Vec::new();
    for i in 0..IPS {
        names.push(Ipv4Addr::from(0x0a00_0001 + i * 8).to_string());
    }
    for i in 0..1000u32 {
        names.push(format!("fd00::{:x}", i + 1));
    }
    for n in &names {
        ix.upsert(IpAddressFacts {
            name: n.as_str().into(),
            family_label: Addr::parse(n).map(|a| a.family),
            owner: None,
        });
    }
    (ix, names)
}

/// Upstream's way: every IP of the family, owners counted over every ServiceCIDR.
fn literal(s: &CidrSet, names: &[String], name: &str, all: &[&str]) -> bool {
    let own = s.get(name).unwrap_or_default();
    for ip in names {
        let Some(addr) = Addr::parse(ip) else {
            continue;
        };
        if !own.iter().any(|p| p.family() == addr.family) {
            continue;
        }
        let owners: Vec<&str> = all
            .iter()
            .flat_map(|n| {
                s.get(n)
                    .unwrap_or_default()
                    .iter()
                    .filter(move |p| p.contains_ip(addr))
                    .map(move |_| *n)
            })
            .collect();
        if owners.len() == 1 && owners[0] == name {
            return false;
        }
    }
    true
}

fn time<F: FnMut() -> R, R>(iters: u32, mut f: F) -> (f64, f64) {
    let mut samples = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let t = Instant::now();
        black_box(f());
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
    )
}

fn main() {
    let t = Instant::now();
    let (ix, names) = ips();
    println!(
        "index build: {} IPAddresses in {:.1} ms",
        ix.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let deleting = |name: &str| CidrState {
        name: name.into(),
        has_finalizer: true,
        deletion_timestamp: Some("2020-01-01T00:00:00Z".parse().unwrap()),
        ready: None,
    };
    let now = "2026-01-01T00:00:00Z".parse().unwrap();

    // 256 smaller ServiceCIDRs tile the /12 (one /20 each), so nothing is orphaned and every IP
    // is covered (the IPv6 part by an equal ServiceCIDR): the worst case for a scan, which must
    // look at all 101k.
    let mut tiles: Vec<(String, Vec<String>)> = (0..256u32)
        .map(|i| {
            (
                format!("tile-{i}"),
                vec![format!("{}/20", Ipv4Addr::from(0x0a00_0000 + (i << 12)))],
            )
        })
        .collect();
    tiles.push(("v6".into(), vec!["fd00::/112".into()]));
    tiles.push((
        "big".into(),
        vec!["10.0.0.0/12".into(), "fd00::/112".into()],
    ));
    let refs: Vec<(&str, Vec<String>)> =
        tiles.iter().map(|(n, c)| (n.as_str(), c.clone())).collect();
    let tiled = cidrs(&refs);
    let all: Vec<&str> = tiles.iter().map(|(n, _)| n.as_str()).collect();

    let cases: Vec<(&str, CidrSet, &str)> = vec![
        (
            "blocked: lone /12 holding 100k IPs",
            cidrs(&[("big", vec!["10.0.0.0/12".into()])]),
            "big",
        ),
        (
            "not blocked: /24 with no IPs among 100k",
            cidrs(&[
                ("big", vec!["10.0.0.0/12".into()]),
                ("empty", vec!["10.100.0.0/24".into()]),
            ]),
            "empty",
        ),
        (
            "overlap: /12 dual-stack tiled by 256 /20s",
            tiled.clone(),
            "big",
        ),
        ("parent: /20 covered by the /12", tiled.clone(), "tile-7"),
    ];
    println!(
        "{:<46} {:>12} {:>12} {:>8}",
        "canDelete via decide()", "median µs", "p99 µs", "blocked"
    );
    for (what, set, name) in &cases {
        let state = deleting(name);
        let acts = decide(&state, set, &ix, now);
        let blocked = acts.iter().any(|a| {
            matches!(
                a,
                groundskeeper_controllers::servicecidr::decide::Action::ReportBlocked(_)
            )
        });
        let (med, p99) = time(2000, || decide(&state, set, &ix, now));
        println!("{what:<46} {med:>12.2} {p99:>12.2} {blocked:>8}");
    }
    let t = Instant::now();
    let ok = literal(&tiled, &names, "big", &all);
    println!(
        "reference, upstream list-and-scan of the tiled case: {:.1} ms (deletable={ok})",
        t.elapsed().as_secs_f64() * 1e3
    );
}
