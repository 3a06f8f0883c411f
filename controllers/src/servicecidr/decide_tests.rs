//! One sync of a ServiceCIDR, judged: finalizer, Ready, the deletion grace and its blockers.

use std::time::Duration;

use jiff::Timestamp;

use super::decide::*;
use super::index::{
    CidrSet, IpAddressFacts, IpIndex,
    fixtures::{ips, set},
};
use super::prefix::{Addr, Family, Prefix};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const DELETED: &str = "2026-01-01T00:00:00Z";

fn live(has_finalizer: bool, ready: Option<ReadyCondition>) -> CidrState {
    CidrState {
        name: "x".into(),
        has_finalizer,
        deletion_timestamp: None,
        ready,
    }
}

fn deleting(ready: Option<ReadyCondition>) -> CidrState {
    CidrState {
        name: "x".into(),
        has_finalizer: true,
        deletion_timestamp: Some(ts(DELETED)),
        ready,
    }
}

/// The row's name, ServiceCIDRs by name with their CIDRs, and the managed IPs that exist.
type Case<'a> = (&'a str, &'a [(&'a str, &'a [&'a str])], &'a [&'a str]);

/// Well past the grace period.
fn later() -> Timestamp {
    ts("2026-01-01T00:01:00Z")
}

#[test]
fn live_cidr_gets_finalizer_then_ready() {
    let s = set(&[("x", &["10.0.1.0/24"])]);
    let ix = IpIndex::default();
    let now = later();
    let other = |status: &str, reason: &str, message: &str| ReadyCondition {
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
    };
    for (name, state, want) in [
        (
            "new: finalizer then Ready",
            live(false, None),
            vec![
                Action::AddFinalizer,
                Action::ApplyReady(ReadyCondition::ready()),
            ],
        ),
        (
            "finalizer, no condition: Ready",
            live(true, None),
            vec![Action::ApplyReady(ReadyCondition::ready())],
        ),
        (
            "finalizer and Ready: nothing",
            live(true, Some(ReadyCondition::ready())),
            vec![],
        ),
        (
            "Ready, no finalizer: finalizer only",
            live(false, Some(ReadyCondition::ready())),
            vec![Action::AddFinalizer],
        ),
        // Any of status, reason or message differing means an apply.
        (
            "status differs",
            live(true, Some(other("False", "", MESSAGE_READY))),
            vec![Action::ApplyReady(ReadyCondition::ready())],
        ),
        (
            "reason differs",
            live(true, Some(other("True", "Whatever", MESSAGE_READY))),
            vec![Action::ApplyReady(ReadyCondition::ready())],
        ),
        (
            "message differs",
            live(true, Some(other("True", "", "ready"))),
            vec![Action::ApplyReady(ReadyCondition::ready())],
        ),
        // A ServiceCIDR that was Terminating and had its deletion... cannot come back, but
        // a stale Terminating condition on a live object is corrected.
        (
            "stale Terminating on a live object",
            live(true, Some(ReadyCondition::terminating())),
            vec![Action::ApplyReady(ReadyCondition::ready())],
        ),
    ] {
        assert_eq!(decide(&state, &s, &ix, now), want, "{name}: {state:?}");
    }
}

#[test]
fn live_cidr_ignores_ips_and_overlaps() {
    let s = set(&[("x", &["10.0.1.0/24"]), ("y", &["10.0.0.0/16"])]);
    let ix = ips(&["10.0.1.5"]);
    assert_eq!(
        decide(&live(true, Some(ReadyCondition::ready())), &s, &ix, later()),
        vec![]
    );
}

fn blocked_ips(actions: &[Action]) -> Option<Vec<String>> {
    actions.iter().find_map(|a| match a {
        Action::ReportBlocked(b) => {
            Some(b.found.iter().map(|b| b.entry.name.to_string()).collect())
        }
        _ => None,
    })
}

#[test]
fn deletion_blocked_by_orphaned_ip() {
    let s = set(&[("x", &["10.0.1.0/24"])]);
    let ix = ips(&["10.0.1.5"]);
    let a = decide(&deleting(Some(ReadyCondition::ready())), &s, &ix, later());
    assert_eq!(blocked_ips(&a), Some(vec!["10.0.1.5".to_string()]));
    assert_eq!(a[1], Action::ApplyReady(ReadyCondition::terminating()));
    assert_eq!(a.len(), 2);
    assert!(!a.contains(&Action::RemoveFinalizer));
    // Already Terminating: no apply, still reported, still no removal.
    let a = decide(
        &deleting(Some(ReadyCondition::terminating())),
        &s,
        &ix,
        later(),
    );
    assert_eq!(a.len(), 1);
    assert!(matches!(a[0], Action::ReportBlocked(_)));
}

#[test]
fn blocked_check_comes_before_grace() {
    let s = set(&[("x", &["10.0.1.0/24"])]);
    let ix = ips(&["10.0.1.5"]);
    let a = decide(&deleting(None), &s, &ix, ts(DELETED));
    assert!(blocked_ips(&a).is_some());
    assert_eq!(
        a.last(),
        Some(&Action::ApplyReady(ReadyCondition::terminating()))
    );
}

/// What must NOT happen: the finalizer is never removed while an IP would be orphaned.
#[test]
fn never_removes_finalizer_while_an_ip_would_be_orphaned() {
    let cases: &[Case] = &[
        ("first usable v4", &[("x", &["10.0.1.0/24"])], &["10.0.1.1"]),
        (
            "last usable v4",
            &[("x", &["10.0.1.0/24"])],
            &["10.0.1.254"],
        ),
        (
            "an IPv4-mapped name is IPv6: a mapped IPv6 CIDR holds it",
            &[("x", &["::ffff:10.0.1.0/120"])],
            &["::ffff:10.0.1.9"],
        ),
        ("last v6", &[("x", &["fd00::/112"])], &["fd00::ffff"]),
        (
            "dual-stack, v6 IP",
            &[("x", &["10.0.1.0/24", "fd00::/112"])],
            &["fd00::1"],
        ),
        (
            "a parent for one family only does not cover the other family's IPs",
            &[
                ("x", &["10.0.1.0/24", "fd00::/112"]),
                ("p", &["10.0.0.0/16"]),
            ],
            &["fd00::2"],
        ),
        (
            "a smaller overlapping CIDR is not a parent and does not contain this IP",
            &[("x", &["10.0.1.0/24"]), ("y", &["10.0.1.128/25"])],
            &["10.0.1.3", "10.0.1.130"],
        ),
        (
            "the smaller CIDR's network address is only contained by x",
            &[("x", &["10.0.1.0/24"]), ("y", &["10.0.1.128/25"])],
            &["10.0.1.128"],
        ),
        (
            "an unparseable extra CIDR does not hide the parseable one",
            &[("x", &["garbage", "10.0.1.0/24"])],
            &["10.0.1.3"],
        ),
    ];
    for (row, cidrs, names) in cases {
        let s = set(cidrs);
        let ix = ips(names);
        for now in [ts(DELETED), later(), ts("2030-01-01T00:00:00Z")] {
            let a = decide(&deleting(None), &s, &ix, now);
            assert!(!a.contains(&Action::RemoveFinalizer), "{row}: {a:?}");
            assert!(blocked_ips(&a).is_some(), "{row}: {a:?}");
        }
    }
}

#[test]
fn not_blocked_cases_remove_after_grace() {
    let cases: &[Case] = &[
        ("no IP", &[("x", &["10.0.1.0/24"])], &[]),
        (
            "network and IPv4 broadcast never count",
            &[("x", &["10.0.1.0/24"])],
            &["10.0.1.0", "10.0.1.255"],
        ),
        ("v6 network", &[("x", &["fd00::/112"])], &["fd00::"]),
        (
            "IPs outside, or of a family x does not have",
            &[("x", &["10.0.1.0/24"])],
            &["10.0.2.1", "fd00::1"],
        ),
        (
            "an IPv4-mapped name is IPv6 (netip.ParseAddr): no IPv4 CIDR contains it",
            &[("x", &["10.0.1.0/24", "fd00::/112"])],
            &["::ffff:10.0.1.9"],
        ),
        (
            "a larger parent: IPs do not matter",
            &[("x", &["10.0.1.0/24"]), ("p", &["10.0.0.0/16"])],
            &["10.0.1.5"],
        ),
        (
            "an equal parent: IPs do not matter",
            &[("x", &["10.0.1.0/24"]), ("p", &["10.0.1.0/24"])],
            &["10.0.1.5"],
        ),
        (
            "a parent in every family",
            &[
                ("x", &["10.0.1.0/24", "fd00::/112"]),
                ("p", &["10.0.0.0/16"]),
                ("q", &["fd00::/64"]),
            ],
            &["10.0.1.5", "fd00::5"],
        ),
        (
            "not a parent, but the IP is also contained by another ServiceCIDR",
            &[("x", &["10.0.1.0/24"]), ("y", &["10.0.1.128/25"])],
            &["10.0.1.130"],
        ),
        (
            "no parseable CIDR: deletable (hasParent stays true)",
            &[("x", &["garbage"])],
            &["10.0.1.5"],
        ),
        ("no CIDR at all", &[("x", &[])], &["10.0.1.5"]),
    ];
    for (row, cidrs, names) in cases {
        let s = set(cidrs);
        let ix = ips(names);
        let a = decide(&deleting(None), &s, &ix, later());
        assert_eq!(a, vec![Action::RemoveFinalizer], "{row}");
    }
}

#[test]
fn grace_period_arithmetic() {
    let s = set(&[("x", &["10.0.1.0/24"])]);
    let ix = IpIndex::default();
    for (now, want) in [
        (
            "2026-01-01T00:00:00Z",
            vec![Action::RequeueAfter(Duration::from_secs(10))],
        ),
        (
            "2026-01-01T00:00:03.25Z",
            vec![Action::RequeueAfter(Duration::from_millis(6750))],
        ),
        (
            "2026-01-01T00:00:09.999999999Z",
            vec![Action::RequeueAfter(Duration::from_nanos(1))],
        ),
        ("2026-01-01T00:00:10Z", vec![Action::RemoveFinalizer]),
        ("2026-01-01T00:00:11Z", vec![Action::RemoveFinalizer]),
        // A clock behind the deletion timestamp waits longer than 10 s, as upstream.
        (
            "2025-12-31T23:59:58Z",
            vec![Action::RequeueAfter(Duration::from_secs(12))],
        ),
    ] {
        assert_eq!(
            decide(&deleting(None), &s, &ix, ts(now)),
            want,
            "deleted at {DELETED}, now {now}"
        );
    }
}

#[test]
fn finalizer_already_gone_means_nothing_to_do() {
    let s = set(&[("x", &["10.0.1.0/24"])]);
    let mut state = deleting(None);
    state.has_finalizer = false;
    assert_eq!(decide(&state, &s, &IpIndex::default(), later()), vec![]);
}

#[test]
fn blocked_report_is_limited() {
    let s = set(&[("x", &["10.0.1.0/24"])]);
    let names: Vec<String> = (1..=30).map(|i| format!("10.0.1.{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let ix = ips(&refs);
    let a = decide(&deleting(None), &s, &ix, later());
    match &a[0] {
        Action::ReportBlocked(b) => {
            assert_eq!(b.found.len(), BLOCKERS_REPORTED);
            assert!(b.more);
        }
        other => panic!("{other:?}"),
    }
}

/// Upstream's `canDeleteCIDR`, written as literally as it reads: parents by counting
/// (ServiceCIDR, CIDR) pairs, then every managed IP of each family with its owners counted.
fn literal_can_delete(
    s: &CidrSet,
    names: &[String],
    ips: &[(String, Option<Family>)],
    me: &str,
) -> bool {
    let own = s.get(me).unwrap_or_default();
    let pairs: Vec<(&str, Prefix)> = names
        .iter()
        .flat_map(|n| {
            s.get(n)
                .unwrap_or_default()
                .iter()
                .map(move |p| (n.as_str(), *p))
        })
        .collect();
    let has_parent = own.iter().all(|p| {
        let parents: Vec<&str> = pairs
            .iter()
            .filter(|(_, q)| q.covers(p))
            .map(|(n, _)| *n)
            .collect();
        !(parents.is_empty() || (parents.len() == 1 && parents[0] == me))
    });
    if has_parent {
        return true;
    }
    for p in own {
        for (ip, label) in ips {
            if *label != Some(p.family()) {
                continue;
            }
            let Some(addr) = Addr::parse(ip) else {
                continue;
            };
            let owners: Vec<&str> = pairs
                .iter()
                .filter(|(_, q)| q.contains_ip(addr))
                .map(|(n, _)| *n)
                .collect();
            if owners.len() == 1 && owners[0] == me {
                return false;
            }
        }
    }
    true
}

/// Random layouts of overlapping dual-stack ServiceCIDRs and IPs (some mislabelled): the
/// decision blocks exactly when upstream's literal algorithm would.
#[test]
fn blocked_exactly_when_upstream_would_be() {
    let mut seed: u64 = 0x5eed;
    let mut rnd = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut outcomes = [0usize; 2];
    for round in 0..400 {
        let mut s = CidrSet::default();
        let mut names = Vec::new();
        for i in 0..(1 + rnd(5)) {
            let mut cidrs = Vec::new();
            if rnd(4) > 0 {
                let bits = 24 + rnd(9);
                cidrs.push(format!("10.0.0.{}/{bits}", rnd(256)));
            }
            if rnd(3) == 0 {
                let bits = 120 + rnd(9);
                cidrs.push(format!("fd00::{:x}/{bits}", rnd(256)));
            }
            if rnd(10) == 0 {
                cidrs.push("garbage".into());
            }
            let name = format!("c{i}");
            s.insert(&name, &cidrs);
            names.push(name);
        }
        let mut ips = Vec::new();
        let mut ix = IpIndex::default();
        for _ in 0..rnd(12) {
            let (name, family) = match rnd(3) {
                0 => (format!("fd00::{:x}", rnd(256)), Family::V6),
                1 => (format!("::ffff:10.0.0.{}", rnd(256)), Family::V6),
                _ => (format!("10.0.0.{}", rnd(256)), Family::V4),
            };
            let label = match rnd(8) {
                0 => None,
                1 => Some(if family == Family::V4 {
                    Family::V6
                } else {
                    Family::V4
                }),
                _ => Some(family),
            };
            ix.upsert(IpAddressFacts {
                name: name.as_str().into(),
                family_label: label,
                owner: None,
            });
            ips.push((name, label));
        }
        // Same address under two names: keep the last, as the index does per name.
        ips.reverse();
        let mut seen = std::collections::HashSet::new();
        ips.retain(|(n, _)| seen.insert(n.clone()));
        for me in &names {
            let mut state = deleting(None);
            state.name = me.clone();
            let blocked = decide(&state, &s, &ix, later())
                .iter()
                .any(|a| matches!(a, Action::ReportBlocked(_)));
            assert_eq!(
                blocked,
                !literal_can_delete(&s, &names, &ips, me),
                "round {round}, {me} in {s:?}, ips {ips:?}"
            );
            outcomes[usize::from(blocked)] += 1;
        }
    }
    assert!(outcomes[0] > 100 && outcomes[1] > 100, "{outcomes:?}");
}
