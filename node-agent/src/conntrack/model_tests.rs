use serde_json::{Value, json};

use super::*;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

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
    let v4: HashSet<SocketAddr> = [sa("10.244.1.5:5353"), sa("10.244.2.7:5353")].into();
    let mut want4: Vec<SocketAddr> = [
        "10.96.0.10:53",
        "192.0.2.1:53",
        "203.0.113.5:53",
        "203.0.113.6:53",
    ]
    .map(sa)
    .to_vec();
    let mut got4: Vec<SocketAddr> = m.ipv4.frontends.keys().copied().collect();
    want4.sort();
    got4.sort();
    assert_eq!(
        got4, want4,
        "Proxy-mode LB IPs and TCP ports are not frontends"
    );
    assert!(
        m.ipv4.frontends.values().all(|s| *s == v4),
        "serving = unset or true"
    );
    assert_eq!(m.ipv4.node_ports, HashMap::from([(30053, v4)]));

    let v6: HashSet<SocketAddr> = [sa("[fd00:1::5]:5353")].into();
    let mut got6: Vec<SocketAddr> = m.ipv6.frontends.keys().copied().collect();
    got6.sort();
    let mut want6 = ["[fd00::a]:53", "[2001:db8::e]:53", "[2001:db8::1b]:53"]
        .map(sa)
        .to_vec();
    want6.sort();
    assert_eq!(got6, want6);
    assert_eq!(m.ipv6.node_ports, HashMap::from([(30053, v6)]));
}

#[test]
fn services_left_out() {
    let slices = dns_slices();
    let with_label = |mut s: Service, k: &str| {
        s.metadata.labels = Some([(k.to_string(), "x".to_string())].into());
        s
    };
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
            "other proxy",
            with_label(dns_service(), LABEL_SERVICE_PROXY_NAME),
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
        (
            "port name mismatch",
            svc(
                "dns",
                json!({"clusterIP": "10.96.0.10", "ports": [{"name": "other", "port": 53, "protocol": "UDP"}]}),
            ),
        ),
        (
            "no slices",
            svc(
                "other",
                json!({"clusterIP": "10.96.0.11", "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
            ),
        ),
    ];
    for (name, s) in cases {
        let m = build([&s], &slices);
        assert!(m.ipv4.is_empty() && m.ipv6.is_empty(), "{name}: {m:?}");
    }
}

#[test]
fn zero_serving_endpoints_skip_the_port() {
    let s = dns_service();
    let slices = vec![slice(
        "dns",
        "IPv4",
        json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
        json!([{"addresses": ["10.244.3.9"], "conditions": {"serving": false}}]),
    )];
    let m = build([&s], &slices);
    assert!(m.ipv4.is_empty(), "{m:?}");
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
        assert!(m.ipv4.is_empty() && m.ipv6.is_empty(), "{label}");
    }
    // A slice of another namespace does not feed this service.
    let mut slices = dns_slices();
    for sl in &mut slices {
        sl.metadata.namespace = Some("elsewhere".into());
    }
    assert!(build([&s], &slices).ipv4.is_empty());
    // FQDN slices never feed anything.
    let mut slices = dns_slices();
    slices[0].address_type = "FQDN".into();
    assert!(build([&s], &slices).ipv4.is_empty());
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
        m.ipv4.frontends[&sa("10.96.0.20:9000")],
        [sa("10.244.1.1:9001"), sa("10.244.1.2:9001")].into(),
        "first address of each endpoint only"
    );
}

#[test]
fn later_service_overwrites_the_same_frontend() {
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
    // Input order does not matter: namespace/name order decides.
    for order in [[&b, &a], [&a, &b]] {
        let m = build(order, &slices);
        assert_eq!(
            m.ipv4.frontends[&sa("192.0.2.9:53")],
            [sa("10.244.0.2:53")].into()
        );
    }
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
