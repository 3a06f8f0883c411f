//! Tests of the UDP service model built from Services, EndpointSlices, ServiceCIDRs and the Node.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use serde_json::{Value, json};

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::addr::parse_ip;
use crate::conntrack::model::Addrs;
use crate::conntrack::model::reference::{Settle, Tombstones, build};
use crate::conntrack::model::*;
use crate::conntrack::netlink::family::Family::{V4, V6};
use crate::conntrack::test_support::sa;

fn svc(name: &str, spec: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name},
        "spec": spec,
    }))
    .unwrap()
}

fn slice(svc: &str, family: &str, ports: Value, endpoints: Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": format!("{svc}-{family}"),
                     "labels": {LABEL_SERVICE_NAME: svc}},
        "addressType": family,
        "ports": ports,
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn dns_service() -> Service {
    svc(
        "dns",
        json!({"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::a"],
               "externalIPs": ["192.0.2.1", "2001:db8::e"],
               "type": "LoadBalancer",
               "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
                         {"name": "dns-tcp", "port": 53, "protocol": "TCP", "nodePort": 30054}]}),
    )
}

fn dns_slices() -> Vec<EndpointSlice> {
    vec![
        slice(
            "dns",
            "IPv4",
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"},
                   {"name": "dns-tcp", "port": 5353, "protocol": "TCP"}]),
            json!([
                {"addresses": ["10.244.1.5"], "conditions": {"ready": true}},
                {"addresses": ["10.244.2.7"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.244.3.9"], "conditions": {"ready": false, "serving": false, "terminating": true}},
            ]),
        ),
        slice(
            "dns",
            "IPv6",
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
            json!([{"addresses": ["fd00:1::5"]}]),
        ),
    ]
}

#[test]
fn cluster_external_ips_node_port_per_family() {
    let mut s = dns_service();
    s.status = Some(
        serde_json::from_value(json!({"loadBalancer": {"ingress": [
            {"ip": "203.0.113.5"},
            {"ip": "203.0.113.6", "ipMode": "VIP"},
            {"ip": "203.0.113.7", "ipMode": "Proxy"},
            {"hostname": "lb.example"},
            {"ip": "2001:db8::1b"},
        ]}}))
        .unwrap(),
    );
    let m = build([&s], &dns_slices());
    let v4: Addrs = [sa("10.244.1.5:5353"), sa("10.244.2.7:5353")].into();
    let mut want4: Vec<SocketAddr> = [
        "10.96.0.10:53",
        "192.0.2.1:53",
        "203.0.113.5:53",
        "203.0.113.6:53",
    ]
    .map(sa)
    .to_vec();
    let mut got4: Vec<SocketAddr> = m[V4].frontends.keys().copied().collect();
    want4.sort();
    got4.sort();
    assert_eq!(
        got4, want4,
        "Proxy-mode LB IPs and TCP ports are not frontends"
    );
    assert!(
        m[V4].frontends.values().all(|s| *s == v4),
        "serving = unset or true"
    );
    assert_eq!(m[V4].node_ports, HashMap::from([(30053, v4)]));

    let v6: Addrs = [sa("[fd00:1::5]:5353")].into();
    let mut got6: Vec<SocketAddr> = m[V6].frontends.keys().copied().collect();
    got6.sort();
    let mut want6 = ["[fd00::a]:53", "[2001:db8::e]:53", "[2001:db8::1b]:53"]
        .map(sa)
        .to_vec();
    want6.sort();
    assert_eq!(got6, want6);
    assert_eq!(m[V6].node_ports, HashMap::from([(30053, v6)]));
}

#[test]
fn services_without_udp_frontends() {
    let cases: Vec<(&str, Service)> = vec![
        (
            "headless",
            svc(
                "dns",
                json!({"clusterIP": "None", "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            ),
        ),
        (
            "external name",
            svc(
                "dns",
                json!({"type": "ExternalName", "externalName": "x.example", "clusterIP": "10.96.0.10",
                                             "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            ),
        ),
        (
            "tcp only",
            svc(
                "dns",
                json!({"clusterIP": "10.96.0.10", "ports": [{"name": "dns-tcp", "port": 53}]}),
            ),
        ),
        (
            "no clusterIP yet",
            svc(
                "dns",
                json!({"ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            ),
        ),
    ];
    for (name, s) in cases {
        let m = build([&s], &dns_slices());
        assert!(m[V4].is_empty() && m[V6].is_empty(), "{name}: {m:?}");
    }
}

#[test]
fn no_serving_endpoint_is_an_empty_set_not_a_skip() {
    let no_slice_port = svc(
        "dns",
        json!({"clusterIP": "10.96.0.10", "type": "NodePort",
               "ports": [{"name": "other", "port": 53, "protocol": "UDP", "nodePort": 30099}]}),
    );
    let no_slices = svc(
        "other",
        json!({"clusterIP": "10.96.0.11", "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
    );
    let not_serving = vec![slice(
        "dns",
        "IPv4",
        json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
        json!([{"addresses": ["10.244.3.9"], "conditions": {"serving": false}}]),
    )];
    let cases: Vec<(&str, Service, Vec<EndpointSlice>, SocketAddr)> = vec![
        (
            "slices match none of the ports",
            no_slice_port,
            dns_slices(),
            sa("10.96.0.10:53"),
        ),
        (
            "no slices at all",
            no_slices,
            dns_slices(),
            sa("10.96.0.11:53"),
        ),
        (
            "only a non-serving endpoint",
            dns_service(),
            not_serving,
            sa("10.96.0.10:53"),
        ),
    ];
    for (name, s, slices, frontend) in cases {
        let m = build([&s], &slices);
        assert_eq!(
            m[V4].frontends.get(&frontend),
            Some(&Addrs::default()),
            "{name}: {m:?}"
        );
        for set in m[V4].node_ports.values() {
            assert!(set.is_empty(), "{name}: nodePort with an empty set too");
        }
    }
    // The NodePort of an endpoint-less port is recorded (empty) as well.
    let m = build([&dns_service()], &[]);
    assert_eq!(m[V4].node_ports.get(&30053), Some(&Addrs::default()));
}

#[test]
fn another_proxys_services_are_foreign() {
    // kube-proxy's informers leave out both labels, on Services as on slices: a Service
    // labelled headless by hand keeps its ClusterIP but gets no rules.
    for label in [LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS] {
        another_proxys_service_is_foreign(label);
    }
}

fn another_proxys_service_is_foreign(label: &str) {
    let mut s = dns_service();
    s.metadata.labels = Some([(label.to_string(), "x".to_string())].into());
    let m = build([&s], &dns_slices());
    assert!(
        m[V4].frontends.is_empty() && m[V4].node_ports.is_empty(),
        "{m:?}"
    );
    assert_eq!(
        m[V4].foreign_frontends,
        [sa("10.96.0.10:53"), sa("192.0.2.1:53")].into()
    );
    assert_eq!(m[V4].foreign_node_ports, [30053].into());
    assert_eq!(
        m[V6].foreign_frontends,
        [sa("[fd00::a]:53"), sa("[2001:db8::e]:53")].into()
    );
}

/// Frontends recorded, none with a serving endpoint.
fn no_serving(m: &Model) -> bool {
    let fams = [&m[V4], &m[V6]];
    fams.iter().all(|f| !f.frontends.is_empty())
        && fams
            .iter()
            .flat_map(|f| f.frontends.values().chain(f.node_ports.values()))
            .all(Addrs::is_empty)
}

#[test]
fn slices_left_out() {
    let s = dns_service();
    for label in [LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME] {
        let mut slices = dns_slices();
        for sl in &mut slices {
            sl.metadata
                .labels
                .as_mut()
                .unwrap()
                .insert(label.into(), "".into());
        }
        let m = build([&s], &slices);
        assert!(no_serving(&m), "{label}: {m:?}");
    }
    // A slice of another namespace does not feed this service.
    let mut slices = dns_slices();
    for sl in &mut slices {
        sl.metadata.namespace = Some("elsewhere".into());
    }
    assert!(no_serving(&build([&s], &slices)));
    // FQDN slices never feed anything.
    let mut slices = dns_slices();
    slices[0].address_type = "FQDN".into();
    let m = build([&s], &slices);
    assert!(m[V4].frontends.values().all(Addrs::is_empty), "{m:?}");
}

#[test]
fn unnamed_ports_and_several_slices() {
    let s = svc(
        "u",
        json!({"clusterIP": "10.96.0.20", "ports": [{"port": 9000, "protocol": "UDP"}]}),
    );
    let mut a = slice(
        "u",
        "IPv4",
        json!([{"port": 9001, "protocol": "UDP"}]),
        json!([{"addresses": ["10.244.1.1"]}]),
    );
    let mut b = a.clone();
    a.metadata.name = Some("u-a".into());
    b.metadata.name = Some("u-b".into());
    b.endpoints =
        serde_json::from_value(json!([{"addresses": ["10.244.1.2", "10.244.1.99"]}])).unwrap();
    let m = build([&s], &[a, b]);
    assert_eq!(
        m[V4].frontends[&sa("10.96.0.20:9000")],
        [
            sa("10.244.1.1:9001"),
            sa("10.244.1.2:9001"),
            sa("10.244.1.99:9001")
        ]
        .into(),
        "every address of a serving endpoint is a backend"
    );
}

#[test]
fn services_claiming_one_frontend_share_it() {
    let a = svc(
        "a",
        json!({"clusterIP": "10.96.0.30", "externalIPs": ["192.0.2.9"],
                             "ports": [{"port": 53, "protocol": "UDP"}]}),
    );
    let b = svc(
        "b",
        json!({"clusterIP": "10.96.0.31", "externalIPs": ["192.0.2.9"],
                             "ports": [{"port": 53, "protocol": "UDP"}]}),
    );
    let sl = |n: &str, ip: &str| {
        slice(
            n,
            "IPv4",
            json!([{"port": 53, "protocol": "UDP"}]),
            json!([{"addresses": [ip]}]),
        )
    };
    let slices = [sl("a", "10.244.0.1"), sl("b", "10.244.0.2")];
    // A flow through the shared frontend is kept when either service would keep it, in any
    // order; each ClusterIP is its own service's alone.
    for (name, order) in [("b first", [&b, &a]), ("a first", [&a, &b])] {
        let m = build(order, &slices);
        assert_eq!(
            m[V4].frontends[&sa("192.0.2.9:53")],
            [sa("10.244.0.1:53"), sa("10.244.0.2:53")].into(),
            "{name}"
        );
        assert_eq!(
            m[V4].frontends[&sa("10.96.0.31:53")],
            [sa("10.244.0.2:53")].into()
        );
        assert_eq!(m[V4].services.len(), 2);
    }
    // A claimant without endpoints adds nothing: the other's flows stay.
    let m = build([&a, &b], &slices[..1]);
    assert_eq!(
        m[V4].frontends[&sa("192.0.2.9:53")],
        [sa("10.244.0.1:53")].into()
    );
    assert_eq!(m[V4].frontends[&sa("10.96.0.31:53")], Addrs::default());
}

#[test]
fn a_port_without_endpoints_settles_before_it_is_judged() {
    use std::time::{Duration, Instant};
    let a = svc(
        "a",
        json!({"clusterIP": "10.96.0.30", "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]}),
    );
    let served = [slice(
        "a",
        "IPv4",
        json!([{"name": "dns", "port": 53, "protocol": "UDP"}]),
        json!([{"addresses": ["10.244.0.1"]}]),
    )];
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut settle = Settle::new(s(5));
    let live = settle.apply(build([&a], &served), t0);
    assert_eq!(live, build([&a], &served), "served: nothing held back");
    assert_eq!(settle.next_change(t0), None);
    // The slice goes: for 5 s the frontends are settling (not judged), then judged empty.
    let bare = build([&a], &[]);
    let m = settle.apply(bare.clone(), t0 + s(1));
    assert!(m[V4].frontends.is_empty() && m[V4].node_ports.is_empty());
    assert_eq!(m[V4].settling_frontends, [sa("10.96.0.30:53")].into());
    assert_eq!(m[V4].settling_node_ports, [30053].into());
    assert!(m[V4].services["ns/a"]["dns"].settling);
    assert_eq!(settle.next_change(t0 + s(2)), Some(s(4)));
    let m = settle.apply(bare.clone(), t0 + s(6));
    assert_eq!(m, bare, "settled: the zero-endpoint rule applies");
    assert_eq!(settle.next_change(t0 + s(6)), None);
    // Served again, then bare again: the settle starts over.
    settle.apply(build([&a], &served), t0 + s(7));
    let m = settle.apply(bare.clone(), t0 + s(8));
    assert_eq!(m[V4].settling_frontends, [sa("10.96.0.30:53")].into());
    // Settling frontends are live ones: no tombstone for them.
    let mut t = Tombstones::new(s(600));
    t.apply(build([&a], &served), t0);
    let m = t.apply(m, t0 + s(8));
    assert!(m[V4].deleted_frontends.is_empty() && m[V4].deleted_node_ports.is_empty());
}

#[test]
fn addresses_are_read_like_parse_ip_sloppy() {
    let cases = [
        ("10.244.1.5", Some("10.244.1.5")),
        ("010.244.001.005", Some("10.244.1.5")),
        (" 10.0.0.1 ", Some("10.0.0.1")),
        ("::ffff:10.0.0.1", Some("10.0.0.1")),
        ("2001:DB8::1", Some("2001:db8::1")),
        ("10.0.0.256", None),
        ("10.0.0", None),
        ("10.0.0.1.2", None),
        ("1.2.3.0004", Some("1.2.3.4")),
        ("1.2.3.+4", None),
        ("", None),
        ("None", None),
    ];
    for (input, want) in cases {
        let want: Option<IpAddr> = want.map(|w| w.parse().unwrap());
        assert_eq!(parse_ip(input), want, "{input:?}");
    }
}

#[test]
fn service_cidrs_ip_addresses_and_node_addresses() {
    let cidr: ServiceCIDR = serde_json::from_value(json!({
        "metadata": {"name": "kubernetes"},
        "spec": {"cidrs": ["10.96.0.0/16", "fd00:10:96::/112", "bogus", "10.96.0.0/99"]},
    }))
    .unwrap();
    let ip = |name: &str| -> IPAddress {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"parentRef": {"resource": "services", "namespace": "ns", "name": "x"}}}))
        .unwrap()
    };
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n"},
        "status": {"addresses": [
            {"type": "InternalIP", "address": "192.168.0.7"},
            {"type": "InternalIP", "address": "fd00:192::7"},
            {"type": "Hostname", "address": "n.example"},
        ]},
    }))
    .unwrap();
    let m = Model::default()
        .with_service_ips(
            [&cidr, &cidr],
            &[ip("10.96.0.10"), ip("fd00:10:96::a"), ip("not-an-ip")],
        )
        .with_node(Some(&node));
    let want4: IpAddr = "10.96.0.10".parse().unwrap();
    assert_eq!(
        m[V4].service_cidrs,
        vec![ServiceIpRange::parse("10.96.0.0/16").unwrap()],
        "parsed once each, junk ignored"
    );
    assert_eq!(m[V6].service_cidrs.len(), 1);
    assert_eq!(m[V4].allocated, [want4].into());
    assert_eq!(m[V6].allocated, ["fd00:10:96::a".parse().unwrap()].into());
    assert_eq!(m[V4].node_ips, ["192.168.0.7".parse().unwrap()].into());
    assert_eq!(m[V6].node_ips, ["fd00:192::7".parse().unwrap()].into());
    assert!(Model::default().with_node(None)[V4].node_ips.is_empty());
}

#[test]
fn tombstones_remember_what_live_services_stopped_holding() {
    use std::time::{Duration, Instant};
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let dns = dns_service();
    let other = svc(
        "other",
        json!({"clusterIP": "10.96.0.50", "externalIPs": ["192.0.2.1"],
               "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
    );
    let mut t = Tombstones::new(Duration::from_secs(600));
    // First model: nothing went yet (after a restart nothing is known to have gone).
    let m = t.apply(build([&dns], &dns_slices()), at(0));
    assert!(m[V4].deleted_frontends.is_empty() && m[V4].deleted_node_ports.is_empty());
    // dns deleted; `other` holds one of its frontends (the ExternalIP).
    let m = t.apply(build([&other], &[]), at(10));
    assert_eq!(
        m[V4].deleted_frontends,
        [sa("10.96.0.10:53")].into(),
        "192.0.2.1:53 is held by a live service again"
    );
    assert_eq!(m[V4].deleted_node_ports, [30053].into());
    assert_eq!(
        m[V6].deleted_frontends,
        [sa("[fd00::a]:53"), sa("[2001:db8::e]:53")].into()
    );
    // Still remembered just before the retention ends, gone after.
    let m = t.apply(build([&other], &[]), at(609));
    assert!(m[V4].deleted_frontends.contains(&sa("10.96.0.10:53")));
    let m = t.apply(build([&other], &[]), at(610));
    assert!(m[V4].deleted_frontends.is_empty() && m[V6].deleted_frontends.is_empty());
    assert!(m[V4].deleted_node_ports.is_empty());
    // A port removed from a live service is remembered like a deleted service.
    let mut tcp_only = other.clone();
    tcp_only.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].protocol = Some("TCP".into());
    let m = t.apply(build([&tcp_only], &[]), at(620));
    assert_eq!(
        m[V4].deleted_frontends,
        [sa("10.96.0.50:53"), sa("192.0.2.1:53")].into()
    );
    // Another proxy taking a service over is not a deletion.
    let mut t = Tombstones::new(Duration::from_secs(600));
    t.apply(build([&dns], &dns_slices()), at(0));
    let mut labelled = dns.clone();
    labelled.metadata.labels =
        Some([(LABEL_SERVICE_PROXY_NAME.to_string(), "x".to_string())].into());
    let m = t.apply(build([&labelled], &dns_slices()), at(5));
    assert!(m[V4].deleted_frontends.is_empty() && m[V4].deleted_node_ports.is_empty());
    // ... and another proxy's service deleted is not remembered either: not ours to judge.
    let m = t.apply(build([], &dns_slices()), at(6));
    assert!(m[V4].deleted_frontends.is_empty() && m[V4].deleted_node_ports.is_empty());
}
