//! Table tests of what a triggered pass looks at after a model change (`focus.rs`): the
//! backends a change took away, and the changes that make the pass a full one (and the IPs
//! released that do not).

use std::collections::HashSet;
use std::net::IpAddr;

use super::focus::{Focus, Scope, removed_backends};
use super::{Addrs, FamilyModel, Model, ServiceIpRange};
use crate::conntrack::netlink::family::Family::{V4, V6};
use crate::conntrack::test_support::{ip, sa};

#[test]
fn removed_backends_are_what_a_change_took_away() {
    let set = |v: &[&str]| -> Addrs { v.iter().map(|s| sa(s)).collect() };
    let with = |f: &[(&str, &[&str])], n: &[(u16, &[&str])]| {
        let mut m = FamilyModel::default();
        for (k, v) in f {
            m.frontends.insert(sa(k), set(v));
        }
        for (k, v) in n {
            m.node_ports.insert(*k, set(v));
        }
        m
    };
    let base = with(
        &[("10.96.0.10:53", &["10.244.1.5:53", "10.244.2.7:53"])],
        &[(30053, &["10.244.1.5:53", "10.244.3.3:53"])],
    );
    let cases: Vec<(&str, FamilyModel, Vec<&str>)> = vec![
        ("nothing changed", base.clone(), vec![]),
        (
            "endpoint added",
            with(
                &[(
                    "10.96.0.10:53",
                    &["10.244.1.5:53", "10.244.2.7:53", "10.244.4.4:53"],
                )],
                &[(30053, &["10.244.1.5:53", "10.244.3.3:53"])],
            ),
            vec![],
        ),
        (
            "one endpoint removed",
            with(
                &[("10.96.0.10:53", &["10.244.1.5:53"])],
                &[(30053, &["10.244.1.5:53", "10.244.3.3:53"])],
            ),
            vec!["10.244.2.7"],
        ),
        (
            "endpoint port changed",
            with(
                &[("10.96.0.10:53", &["10.244.1.5:5353", "10.244.2.7:53"])],
                &[(30053, &["10.244.1.5:53", "10.244.3.3:53"])],
            ),
            vec!["10.244.1.5"],
        ),
        (
            "no endpoint left (flows never DNATed are in scope as flows to the frontend)",
            with(&[("10.96.0.10:53", &[])], &[(30053, &[])]),
            vec!["10.244.1.5", "10.244.2.7", "10.244.3.3"],
        ),
        (
            "service gone (or deleted, or foreign)",
            FamilyModel::default(),
            vec!["10.244.1.5", "10.244.2.7", "10.244.3.3"],
        ),
    ];
    for (name, new, want) in cases {
        let want: HashSet<IpAddr> = want.iter().map(|s| ip(s)).collect();
        assert_eq!(removed_backends(&base, &new), want, "{name}");
    }
}

#[test]
fn a_released_ip_that_a_udp_frontend_has_makes_the_triggered_pass_a_full_one() {
    let mut old = Model::default();
    old[V4].allocated = [ip("10.96.0.10"), ip("10.96.0.11")].into();
    old[V4]
        .frontends
        .insert(sa("10.96.0.11:53"), [sa("10.244.1.5:53")].into());
    let mut new = old.clone();
    new[V4].allocated.insert(ip("10.96.0.12"));
    new[V4]
        .frontends
        .insert(sa("10.96.0.11:53"), Addrs::default());
    let f = Focus::between(&old, &new).expect("an IP allocated: focused");
    assert_eq!(
        f[V4],
        Scope {
            frontends: [sa("10.96.0.11:53")].into(),
            node_ports: HashSet::new(),
            backends: [ip("10.244.1.5")].into(),
        }
    );
    assert!(f[V6].is_empty());
    let mut other_node_ips = new.clone();
    other_node_ips[V4].node_ips.insert(ip("192.168.0.8"));
    assert_eq!(
        Focus::between(&old, &other_node_ips),
        None,
        "other Node addresses: full"
    );
    let mut other_cidrs = new.clone();
    other_cidrs[V6].service_cidrs = vec![ServiceIpRange::parse("fd00::/112").unwrap()];
    assert_eq!(
        Focus::between(&old, &other_cidrs),
        None,
        "another ServiceCIDR: full"
    );
    // 10.96.0.10 is no UDP frontend's (a TCP-only Service's ClusterIP): flows to it are
    // judged as orphans, by full passes; the change's focus stays what it was.
    let mut tcp_gone = new.clone();
    tcp_gone[V4].allocated.remove(&ip("10.96.0.10"));
    assert_eq!(
        Focus::between(&old, &tcp_gone),
        Focus::between(&old, &new),
        "an IP released that no UDP frontend has: the same focus"
    );
    // 10.96.0.11 is a live UDP frontend's in both models.
    let mut udp_gone = new.clone();
    udp_gone[V4].allocated.remove(&ip("10.96.0.11"));
    assert_eq!(
        Focus::between(&old, &udp_gone),
        None,
        "an IP released that a live UDP frontend has: full"
    );
    // A UDP service deleted earlier: its frontend is remembered, its ClusterIP still held.
    let mut remembered = Model::default();
    remembered[V4].allocated = [ip("10.96.0.12")].into();
    remembered[V4]
        .deleted_frontends
        .insert(sa("10.96.0.12:5353"));
    let mut released = remembered.clone();
    released[V4].allocated.clear();
    assert_eq!(
        Focus::between(&remembered, &released),
        None,
        "an IP released that a deleted UDP frontend has: full (rule 2 judges it again)"
    );
    let mut foreign = Model::default();
    foreign[V6].allocated = [ip("fd00::12")].into();
    foreign[V6].foreign_frontends.insert(sa("[fd00::12]:53"));
    let mut foreign_gone = foreign.clone();
    foreign_gone[V6].allocated.clear();
    foreign_gone[V6].foreign_frontends.clear();
    assert_eq!(
        Focus::between(&foreign, &foreign_gone),
        None,
        "an IP released that another proxy's UDP frontend had: full"
    );
    let mut grown = Model::default();
    grown[V4].allocated = [ip("10.96.0.12")].into();
    grown[V4].deleted_frontends.insert(sa("10.96.0.12:5353"));
    assert_eq!(
        Focus::between(&released, &grown),
        Some(Focus::default()),
        "an IP allocated again: nothing in scope (rule 2 keeps the flows now)"
    );
}
