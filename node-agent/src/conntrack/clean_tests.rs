use super::*;
use crate::conntrack::msg::{IPPROTO_SCTP, IPPROTO_TCP};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A kube-proxy-shaped DNAT entry: client -> frontend, reply backend -> client.
fn flow(proto: u8, client: &str, frontend: &str, backend: &str) -> Entry {
    Entry {
        id: Some(1),
        ..Entry::dnat(proto, sa(client), sa(frontend), sa(backend))
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
    m
}

#[test]
fn stale_decisions() {
    let m = model();
    let c = "10.0.0.1:40000";
    let cases = [
        (
            "serving backend kept",
            flow(IPPROTO_UDP, c, "10.96.0.10:53", "10.244.1.5:53"),
            None,
        ),
        (
            "second backend kept",
            flow(IPPROTO_UDP, c, "10.96.0.10:53", "10.244.2.7:53"),
            None,
        ),
        (
            "removed backend",
            flow(IPPROTO_UDP, c, "10.96.0.10:53", "10.244.9.9:53"),
            Some(Stale::Frontend),
        ),
        (
            "old endpoint port",
            flow(IPPROTO_UDP, c, "10.96.0.10:53", "10.244.1.5:5353"),
            Some(Stale::Frontend),
        ),
        (
            "not DNATed",
            flow(IPPROTO_UDP, c, "10.96.0.10:53", "10.96.0.10:53"),
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
            "other port of the IP",
            flow(IPPROTO_UDP, c, "10.96.0.10:54", "10.244.9.9:54"),
            None,
        ),
        (
            "unrelated IP",
            flow(IPPROTO_UDP, c, "8.8.8.8:53", "8.8.8.8:53"),
            None,
        ),
        (
            "nodeport any IP, serving",
            flow(IPPROTO_UDP, c, "192.168.0.7:30053", "10.244.1.5:53"),
            None,
        ),
        (
            "nodeport any IP, gone",
            flow(IPPROTO_UDP, c, "192.168.0.9:30053", "10.244.2.7:53"),
            Some(Stale::NodePort),
        ),
        (
            "nodeport TCP",
            flow(IPPROTO_TCP, c, "192.168.0.9:30053", "10.244.2.7:53"),
            None,
        ),
        (
            "ipv6 serving",
            flow(
                IPPROTO_UDP,
                "[2001:db8::1]:4000",
                "[fd00::a]:53",
                "[fd00:1::5]:5353",
            ),
            None,
        ),
        (
            "ipv6 gone",
            flow(
                IPPROTO_UDP,
                "[2001:db8::1]:4000",
                "[fd00::a]:53",
                "[fd00:1::6]:5353",
            ),
            Some(Stale::Frontend),
        ),
    ];
    for (name, e, want) in cases {
        assert_eq!(stale(&e, &m), want, "{name}: {e}");
        assert_eq!(is_stale(&e, &m), want.is_some(), "{name}");
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
    assert_eq!(stale(&e, &m), None);
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
    assert_eq!(stale(&e, &m), None);
}

#[test]
fn empty_model_deletes_nothing() {
    let m = FamilyModel::default();
    assert!(m.is_empty());
    let e = flow(IPPROTO_UDP, "10.0.0.1:1", "10.96.0.10:53", "10.244.9.9:53");
    assert!(!is_stale(&e, &m));
}

#[test]
fn gc_interval_adapts_like_cilium() {
    let s = Duration::from_secs;
    let (min, max) = (s(10), s(300));
    let cases = [
        // (prev, scanned, deleted, want)
        (s(60), 0, 0, s(60)),
        (s(60), 1000, 0, s(90)),
        (s(60), 1000, 49, s(90)),
        (s(60), 1000, 50, s(60)),
        (s(60), 1000, 250, s(60)),
        (s(60), 1000, 500, s(30)),
        (s(60), 1000, 1000, s(10)), // ratio capped at 0.9 -> 6s -> clamped to min
        (s(100), 1000, 950, s(10)),
        (s(250), 1000, 0, s(300)), // 375 -> max
        (s(300), 10, 0, s(300)),
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
