//! Table tests of the staleness rules in `decide.rs`: which flows a model makes stale, and why.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use super::decide::{Stale, next_interval};
use super::model::removed::Removed;
use super::model::{Addrs, FamilyModel, ServiceIpRange};
use super::netlink::msg::{Entry, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};
use super::pass::flow_of;
use super::test_support::{dnat, ip, sa};

/// The rules read each entry's fields as a pass does ([`flow_of`]).
fn stale(e: &Entry, m: &FamilyModel, host: &HashSet<IpAddr>) -> Option<Stale> {
    super::decide::stale(&flow_of(e), m, host)
}

fn is_stale(e: &Entry, m: &FamilyModel, host: &HashSet<IpAddr>) -> bool {
    super::decide::is_stale(&flow_of(e), m, host)
}

fn staleness(
    e: &Entry,
    m: &FamilyModel,
    host: &HashSet<IpAddr>,
    removed: &Removed,
) -> Option<Stale> {
    super::decide::staleness(&flow_of(e), m, host, removed)
}

/// A kube-proxy-shaped DNAT entry: client -> frontend, reply backend -> client.
fn flow(proto: u8, client: &str, frontend: &str, backend: &str) -> Entry {
    Entry {
        id: Some(1),
        ..dnat(proto, client, frontend, backend)
    }
}

fn model() -> FamilyModel {
    let mut m = FamilyModel::default();
    m.frontends.insert(
        sa("10.96.0.10:53"),
        [sa("10.244.1.5:53"), sa("10.244.2.7:53")].into(),
    );
    m.frontends
        .insert(sa("[fd00::a]:53"), [sa("[fd00:1::5]:5353")].into());
    m.node_ports.insert(30053, [sa("10.244.1.5:53")].into());
    // A live service with no serving endpoint.
    m.frontends.insert(sa("10.96.0.11:53"), Addrs::default());
    m.frontends.insert(sa("192.0.2.11:53"), Addrs::default());
    m.node_ports.insert(30011, Addrs::default());
    // Another proxy's service.
    m.foreign_frontends.insert(sa("10.96.0.12:53"));
    m.foreign_node_ports.insert(30012);
    // A deleted service, and one whose frontend a live service took over.
    m.deleted_frontends.insert(sa("10.96.0.13:53"));
    m.deleted_frontends.insert(sa("192.0.2.13:53"));
    m.deleted_frontends.insert(sa("10.96.0.10:53"));
    m.deleted_frontends.insert(sa("10.96.0.21:53"));
    m.deleted_node_ports.insert(30013);
    m.deleted_node_ports.insert(30053);
    m.service_cidrs = vec![ServiceIpRange::parse("10.96.0.0/16").unwrap()];
    m.allocated = [
        ip("10.96.0.10"),
        ip("10.96.0.11"),
        ip("10.96.0.12"),
        ip("10.96.0.20"),
        ip("10.96.0.21"),
    ]
    .into();
    m.node_ips = [ip("192.168.0.7"), ip("198.51.100.7")].into();
    m
}

/// The host owns 192.168.0.7 and 192.168.0.9; 198.51.100.7 is only in the Node's status.
fn host() -> HashSet<IpAddr> {
    [ip("192.168.0.7"), ip("192.168.0.9")].into()
}

#[test]
fn stale_decisions() {
    let m = model();
    let c = "10.0.0.1:40000";
    let u = IPPROTO_UDP;
    let cases = [
        (
            "serving backend kept",
            flow(u, c, "10.96.0.10:53", "10.244.1.5:53"),
            None,
        ),
        (
            "second backend kept",
            flow(u, c, "10.96.0.10:53", "10.244.2.7:53"),
            None,
        ),
        (
            "removed backend",
            flow(u, c, "10.96.0.10:53", "10.244.9.9:53"),
            Some(Stale::Frontend),
        ),
        (
            "old endpoint port",
            flow(u, c, "10.96.0.10:53", "10.244.1.5:5353"),
            Some(Stale::Frontend),
        ),
        (
            "not DNATed",
            flow(u, c, "10.96.0.10:53", "10.96.0.10:53"),
            Some(Stale::Frontend),
        ),
        (
            "TCP never",
            flow(IPPROTO_TCP, c, "10.96.0.10:53", "10.244.9.9:53"),
            None,
        ),
        (
            "SCTP never",
            flow(IPPROTO_SCTP, c, "10.96.0.10:53", "10.244.9.9:53"),
            None,
        ),
        (
            "other port of an allocated IP",
            flow(u, c, "10.96.0.10:54", "10.244.9.9:54"),
            None,
        ),
        ("unrelated IP", flow(u, c, "8.8.8.8:53", "8.8.8.8:53"), None),
        // Rule 1: no serving endpoint.
        (
            "no endpoints: ClusterIP",
            flow(u, c, "10.96.0.11:53", "10.244.1.5:53"),
            Some(Stale::Frontend),
        ),
        (
            "no endpoints: ExternalIP",
            flow(u, c, "192.0.2.11:53", "10.244.1.5:53"),
            Some(Stale::Frontend),
        ),
        (
            "no endpoints: TCP never",
            flow(IPPROTO_TCP, c, "10.96.0.11:53", "10.244.1.5:53"),
            None,
        ),
        (
            "no endpoints: NodePort",
            flow(u, c, "192.168.0.7:30011", "10.244.1.5:53"),
            Some(Stale::NodePort),
        ),
        (
            "no endpoints: NodePort to a remote host",
            flow(u, c, "203.0.113.1:30011", "203.0.113.1:30011"),
            None,
        ),
        // Another proxy's service: never ours.
        (
            "foreign frontend",
            flow(u, c, "10.96.0.12:53", "10.244.9.9:53"),
            None,
        ),
        (
            "foreign nodePort",
            flow(u, c, "192.168.0.7:30012", "10.244.9.9:53"),
            None,
        ),
        // Rule 2: deleted frontends.
        (
            "deleted: DNATed",
            flow(u, c, "10.96.0.13:53", "10.244.1.5:53"),
            Some(Stale::DeletedFrontend),
        ),
        (
            "deleted ExternalIP: DNATed",
            flow(u, c, "192.0.2.13:53", "10.244.1.5:53"),
            Some(Stale::DeletedFrontend),
        ),
        (
            "deleted ExternalIP: not DNATed (real host now)",
            flow(u, c, "192.0.2.13:53", "192.0.2.13:53"),
            None,
        ),
        (
            "deleted ClusterIP allocated again (new service not seen yet)",
            flow(u, c, "10.96.0.21:53", "10.244.1.5:53"),
            None,
        ),
        (
            "deleted: TCP never",
            flow(IPPROTO_TCP, c, "10.96.0.13:53", "10.244.1.5:53"),
            None,
        ),
        (
            "deleted but live again: the live service decides",
            flow(u, c, "10.96.0.10:53", "10.244.1.5:53"),
            None,
        ),
        (
            "deleted nodePort: DNATed to the host",
            flow(u, c, "192.168.0.9:30013", "10.244.1.5:53"),
            Some(Stale::DeletedNodePort),
        ),
        (
            "deleted nodePort: not DNATed",
            flow(u, c, "192.168.0.9:30013", "192.168.0.9:30013"),
            None,
        ),
        (
            "deleted nodePort: remote host",
            flow(u, c, "203.0.113.1:30013", "203.0.113.1:30013"),
            None,
        ),
        (
            "deleted nodePort: DNATed to a remote address",
            flow(u, c, "203.0.113.1:30013", "10.244.1.5:53"),
            None,
        ),
        (
            "deleted nodePort live again",
            flow(u, c, "192.168.0.7:30053", "10.244.1.5:53"),
            None,
        ),
        // Rule 3: orphaned service IPs.
        (
            "orphan: DNATed",
            flow(u, c, "10.96.7.7:53", "10.244.1.5:53"),
            Some(Stale::OrphanedServiceIp),
        ),
        (
            "orphan: not DNATed",
            flow(u, c, "10.96.7.7:53", "10.96.7.7:53"),
            None,
        ),
        (
            "orphan: TCP never",
            flow(IPPROTO_TCP, c, "10.96.7.7:53", "10.244.1.5:53"),
            None,
        ),
        (
            "IPAddress but no Service yet",
            flow(u, c, "10.96.0.20:53", "10.244.1.5:53"),
            None,
        ),
        (
            "outside every ServiceCIDR",
            flow(u, c, "10.97.0.1:53", "10.244.1.5:53"),
            None,
        ),
        (
            "allocated service IP on a nodePort number: never the NodePort rule",
            flow(u, c, "10.96.0.20:30053", "10.244.9.9:53"),
            None,
        ),
        // Rule 4: NodePort only on this node's addresses.
        (
            "nodeport host IP, serving",
            flow(u, c, "192.168.0.7:30053", "10.244.1.5:53"),
            None,
        ),
        (
            "nodeport host IP, gone",
            flow(u, c, "192.168.0.9:30053", "10.244.2.7:53"),
            Some(Stale::NodePort),
        ),
        (
            "nodeport host IP, not DNATed",
            flow(u, c, "192.168.0.9:30053", "192.168.0.9:30053"),
            Some(Stale::NodePort),
        ),
        (
            "nodeport Node status IP, DNATed, gone",
            flow(u, c, "198.51.100.7:30053", "10.244.2.7:53"),
            Some(Stale::NodePort),
        ),
        (
            "nodeport Node status IP not owned, not DNATed",
            flow(u, c, "198.51.100.7:30053", "198.51.100.7:30053"),
            None,
        ),
        (
            "pod egress to a remote host on a nodePort number",
            flow(u, c, "203.0.113.1:30053", "203.0.113.1:30053"),
            None,
        ),
        (
            "DNATed to a remote address on a nodePort number",
            flow(u, c, "203.0.113.1:30053", "10.244.2.7:53"),
            None,
        ),
        (
            "nodeport TCP",
            flow(IPPROTO_TCP, c, "192.168.0.9:30053", "10.244.2.7:53"),
            None,
        ),
        (
            "ipv6 serving",
            flow(u, "[2001:db8::1]:4000", "[fd00::a]:53", "[fd00:1::5]:5353"),
            None,
        ),
        (
            "ipv6 gone",
            flow(u, "[2001:db8::1]:4000", "[fd00::a]:53", "[fd00:1::6]:5353"),
            Some(Stale::Frontend),
        ),
    ];
    let host = host();
    for (name, e, want) in cases {
        assert_eq!(stale(&e, &m, &host), want, "{name}: {e}");
        assert_eq!(is_stale(&e, &m, &host), want.is_some(), "{name}");
    }
}

#[test]
fn without_host_addresses_only_dnated_flows_to_node_status_ips() {
    let m = model();
    let none = HashSet::new();
    let c = "10.0.0.1:1";
    let cases = [
        (
            "host IP unknown",
            flow(IPPROTO_UDP, c, "192.168.0.9:30053", "10.244.2.7:53"),
            None,
        ),
        (
            "Node status IP, DNATed",
            flow(IPPROTO_UDP, c, "192.168.0.7:30053", "10.244.2.7:53"),
            Some(Stale::NodePort),
        ),
        (
            "Node status IP, not DNATed",
            flow(IPPROTO_UDP, c, "192.168.0.7:30053", "192.168.0.7:30053"),
            None,
        ),
    ];
    for (name, e, want) in cases {
        assert_eq!(stale(&e, &m, &none), want, "{name}: {e}");
    }
}

#[test]
fn a_matching_frontend_decides_before_the_node_port_rule() {
    // A ClusterIP on port 30053 (which is also another service's NodePort) whose backend
    // serves it is kept.
    let mut m = model();
    m.frontends
        .insert(sa("10.96.0.20:30053"), [sa("10.244.3.3:30053")].into());
    let e = flow(
        IPPROTO_UDP,
        "10.0.0.1:1",
        "10.96.0.20:30053",
        "10.244.3.3:30053",
    );
    assert_eq!(stale(&e, &m, &host()), None);
}

#[test]
fn ipv4_mapped_addresses_compare_as_ipv4() {
    let mut m = FamilyModel::default();
    m.frontends
        .insert(sa("10.96.0.10:53"), [sa("10.244.1.5:53")].into());
    let e = flow(
        IPPROTO_UDP,
        "[::ffff:10.0.0.1]:1",
        "[::ffff:10.96.0.10]:53",
        "[::ffff:10.244.1.5]:53",
    );
    assert_eq!(stale(&e, &m, &HashSet::new()), None);
}

#[test]
fn empty_model_deletes_nothing() {
    let m = FamilyModel::default();
    assert!(m.is_empty());
    let e = flow(IPPROTO_UDP, "10.0.0.1:1", "10.96.0.10:53", "10.244.9.9:53");
    assert!(!is_stale(&e, &m, &host()));
}

#[test]
fn cidr_parse_and_contains() {
    let cases = [
        ("10.96.0.0/16", "10.96.255.1", Some(true)),
        ("10.96.0.0/16", "10.97.0.1", Some(false)),
        ("10.96.0.0/16", "::ffff:10.96.0.1", Some(true)),
        ("10.96.0.0/16", "fd00::1", Some(false)),
        ("fd00:10:96::/112", "fd00:10:96::ffff", Some(true)),
        ("fd00:10:96::/112", "fd00:10:96::1:0", Some(false)),
        ("0.0.0.0/0", "1.2.3.4", Some(true)),
        ("::/0", "fd00::1", Some(true)),
        ("10.0.0.1/32", "10.0.0.1", Some(true)),
        ("10.96.0.0/33", "10.96.0.1", None),
        ("10.96.0.0/", "10.96.0.1", None),
        ("10.96.0.0/+1", "10.96.0.1", None),
        ("10.96.0.0", "10.96.0.1", None),
        ("nonsense/8", "10.96.0.1", None),
        ("fd00::/129", "fd00::1", None),
        ("", "10.96.0.1", None),
    ];
    for (cidr, addr, want) in cases {
        let got = ServiceIpRange::parse(cidr).map(|c| c.contains(ip(addr)));
        assert_eq!(got, want, "{cidr} contains {addr}");
    }
}

#[test]
fn gc_interval_adapts_like_cilium() {
    let s = Duration::from_secs;
    let (min, max) = (s(10), s(300));
    let cases = [
        // (prev, scanned, deleted, want)
        (s(60), 0, 0, s(60)),
        (s(60), 1000, 0, s(60)), // deleted nothing: unchanged (Cilium: ratio 0 returns early)
        (s(60), 1000, 1, s(90)),
        (s(60), 1000, 49, s(90)),
        (s(60), 1000, 50, s(60)),
        (s(60), 1000, 250, s(60)),
        (s(60), 1000, 500, s(30)),
        (s(60), 1000, 1000, s(10)), // ratio capped at 0.9 -> 6s -> clamped to min
        (s(100), 1000, 950, s(10)),
        (s(250), 1000, 1, s(300)), // 375 -> max
        (s(300), 10, 0, s(300)),
        (s(300), 1000, 1, s(300)),
        (s(11), 100, 30, s(10)), // 7.7 -> 8 -> min
        (s(5), 0, 0, s(10)),     // below min: clamped even without a ratio
    ];
    for (prev, scanned, deleted, want) in cases {
        assert_eq!(
            next_interval(prev, scanned, deleted, min, max),
            want,
            "prev={prev:?} scanned={scanned} deleted={deleted}"
        );
    }
}

#[test]
fn a_foreign_or_settling_claim_keeps_every_flow_through_the_frontend() {
    let mut m = model();
    let c = "10.0.0.1:40000";
    let dead = flow(IPPROTO_UDP, c, "10.96.0.10:53", "10.244.9.9:53");
    let to_node = flow(IPPROTO_UDP, c, "192.168.0.7:30053", "10.244.9.9:53");
    assert_eq!(stale(&dead, &m, &host()), Some(Stale::Frontend));
    assert_eq!(stale(&to_node, &m, &host()), Some(Stale::NodePort));
    // Another proxy's service claims the same frontend and nodePort: not ours to judge.
    m.foreign_frontends.insert(sa("10.96.0.10:53"));
    m.foreign_node_ports.insert(30053);
    assert_eq!(stale(&dead, &m, &host()), None);
    assert_eq!(stale(&to_node, &m, &host()), None);
    // A claimant without endpoints for less than the settle time: not judged either.
    let mut m = model();
    m.frontends.remove(&sa("10.96.0.10:53"));
    m.settling_frontends.insert(sa("10.96.0.10:53"));
    m.node_ports.remove(&30053);
    m.settling_node_ports.insert(30053);
    assert_eq!(stale(&dead, &m, &host()), None);
    assert_eq!(stale(&to_node, &m, &host()), None);
}

/// The staleness a pass acts on: a flow through a live key with serving endpoints, to a backend
/// that is not one of them, goes at once only when the agent saw that backend serve that key
/// and stop; otherwise it waits the grace as `UnseenBackend`. Everything else is `stale`'s.
#[test]
fn only_backends_seen_removed_go_at_once() {
    use super::model::removed::Removed;
    let m = model();
    // Before: 10.244.3.9 served the ClusterIP and the nodePort, 10.244.5.5 only the nodePort.
    let mut old = m.clone();
    old.frontends
        .get_mut(&sa("10.96.0.10:53"))
        .unwrap()
        .extend([sa("10.244.3.9:53")]);
    old.node_ports
        .get_mut(&30053)
        .unwrap()
        .extend([sa("10.244.3.9:53"), sa("10.244.5.5:53")]);
    let mut seen = Removed::default();
    seen.observe(&old, &m, std::time::Instant::now());
    let never = Removed::default();
    let c = "10.0.0.1:40000";
    let u = IPPROTO_UDP;
    let cases = [
        (
            "seen removed from the frontend: at once",
            flow(u, c, "10.96.0.10:53", "10.244.3.9:53"),
            &seen,
            Some(Stale::Frontend),
        ),
        (
            "never seen serving (the watch may lag the proxy): waits",
            flow(u, c, "10.96.0.10:53", "10.244.4.4:53"),
            &seen,
            Some(Stale::UnseenBackend),
        ),
        (
            "a removal the agent did not see (after a start): waits",
            flow(u, c, "10.96.0.10:53", "10.244.3.9:53"),
            &never,
            Some(Stale::UnseenBackend),
        ),
        (
            "seen removed from another key only: waits",
            flow(u, c, "10.96.0.10:53", "10.244.5.5:53"),
            &seen,
            Some(Stale::UnseenBackend),
        ),
        (
            "serving backend kept",
            flow(u, c, "10.96.0.10:53", "10.244.1.5:53"),
            &never,
            None,
        ),
        (
            "no serving endpoint: at once (zero-endpoint rule)",
            flow(u, c, "10.96.0.11:53", "10.244.4.4:53"),
            &never,
            Some(Stale::Frontend),
        ),
        (
            "nodePort, seen removed: at once",
            flow(u, c, "192.168.0.7:30053", "10.244.5.5:53"),
            &seen,
            Some(Stale::NodePort),
        ),
        (
            "nodePort, never seen serving: waits",
            flow(u, c, "192.168.0.7:30053", "10.244.4.4:53"),
            &seen,
            Some(Stale::UnseenBackend),
        ),
        (
            "nodePort with no serving endpoint: at once",
            flow(u, c, "192.168.0.7:30011", "10.244.4.4:53"),
            &never,
            Some(Stale::NodePort),
        ),
        (
            "deleted frontend: at once",
            flow(u, c, "10.96.0.13:53", "10.244.4.4:53"),
            &never,
            Some(Stale::DeletedFrontend),
        ),
        (
            "orphaned service IP: its own grace",
            flow(u, c, "10.96.0.30:53", "10.244.4.4:53"),
            &never,
            Some(Stale::OrphanedServiceIp),
        ),
        (
            "ipv6, never seen serving: waits",
            flow(u, "[2001:db8::1]:4000", "[fd00::a]:53", "[fd00:1::6]:5353"),
            &never,
            Some(Stale::UnseenBackend),
        ),
    ];
    let host = host();
    for (name, e, removed, want) in cases {
        assert_eq!(staleness(&e, &m, &host, removed), want, "{name}: {e}");
    }
}
