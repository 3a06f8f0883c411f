//! The projection's rule, over generated objects: the model built from projected Services,
//! EndpointSlices, ServiceCIDRs, IPAddresses and Node equals the model built from the whole
//! objects, whatever else the objects carry (TCP and SCTP ports, odd protocols and port names,
//! FQDN slices, conditions in every combination, leading-zero and mapped addresses, labels and
//! annotations, managedFields, targetRefs, topology). And the facts keep nothing else.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use serde_json::{Value, json};
use testkit::rng::Rng;

use super::project;
use super::reference::whole;
use crate::conntrack::model::{
    self, LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, Model,
};
use crate::conntrack::netlink::family::Family;
use crate::conntrack::wire::{WireService, WireSlice};

const NAMESPACES: [&str; 2] = ["default", "kube-system"];
const PROTOCOLS: [Option<&str>; 5] = [Some("UDP"), Some("UDP"), Some("TCP"), Some("SCTP"), None];
const PORT_NAMES: [Option<&str>; 4] = [None, Some("dns"), Some("a"), Some("")];
const V4: [&str; 6] = [
    "10.96.0.10",
    "10.96.0.11",
    "10.244.0.5",
    "10.244.0.06",
    "192.0.2.1",
    "::ffff:10.244.0.5",
];
const V6: [&str; 4] = [
    "fd00:10:96::a",
    "fd00:10:96::b",
    "fd00:10:244::5",
    "2001:db8::1",
];

/// The weight an object carries that the model never reads.
fn noise(rng: &mut Rng) -> Value {
    json!({
        "uid": format!("uid-{}", rng.next_u64()),
        "resourceVersion": format!("{}", rng.below(100_000)),
        "generation": 3,
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"big\": true}",
                        "endpoints.kubernetes.io/last-change-trigger-time": "2026-11-25T18:00:00Z"},
        "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                           "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:ports": {}}}}],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "x", "uid": "u"}],
        "finalizers": ["example.com/f"],
    })
}

fn labels(rng: &mut Rng, service: Option<&str>) -> Value {
    let mut l = serde_json::Map::new();
    l.insert("app".into(), json!("x"));
    if let Some(s) = service {
        l.insert(LABEL_SERVICE_NAME.into(), json!(s));
    }
    if rng.chance(10) {
        l.insert(LABEL_SERVICE_PROXY_NAME.into(), json!("other-proxy"));
    }
    if rng.chance(5) {
        l.insert(LABEL_HEADLESS.into(), json!(""));
    }
    Value::Object(l)
}

fn meta(rng: &mut Rng, ns: &str, name: &str, service: Option<&str>) -> Value {
    let mut m = noise(rng);
    m["namespace"] = json!(ns);
    m["name"] = json!(name);
    m["labels"] = labels(rng, service);
    m
}

pub(in crate::conntrack) fn addr(rng: &mut Rng) -> &'static str {
    if rng.chance(70) {
        rng.pick(&V4)
    } else {
        rng.pick(&V6)
    }
}

fn opt<T: Into<Value>>(v: Option<T>) -> Value {
    v.map(Into::into).unwrap_or(Value::Null)
}

pub(in crate::conntrack) fn service(rng: &mut Rng, ns: &str, name: &str) -> Service {
    let ports: Vec<Value> = (0..rng.below(4))
        .map(|_| {
            json!({
                "name": opt(rng.pick(&PORT_NAMES)),
                "protocol": opt(rng.pick(&PROTOCOLS)),
                "port": rng.pick(&[53, 53, 80, 0, 70000]),
                "targetPort": 5353,
                "nodePort": opt(rng.chance(40).then(|| rng.pick(&[30053, 30054, 0]))),
                "appProtocol": "dns",
            })
        })
        .collect();
    let cluster_ips: Vec<&str> = (0..rng.below(3)).map(|_| addr(rng)).collect();
    let mut spec = json!({
        "type": opt(rng.chance(80).then(|| rng.pick(&["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]))),
        "ports": ports,
        "selector": {"app": "x"},
        "sessionAffinity": "None",
        "externalTrafficPolicy": "Local",
        "healthCheckNodePort": 31000,
        "externalName": "example.com",
    });
    match rng.below(4) {
        0 => spec["clusterIP"] = json!("None"),
        1 => spec["clusterIP"] = json!(cluster_ips.first().copied().unwrap_or("10.96.0.10")),
        2 => spec["clusterIPs"] = json!(cluster_ips),
        _ => {}
    }
    if rng.chance(30) {
        spec["externalIPs"] = json!((0..rng.below(3)).map(|_| addr(rng)).collect::<Vec<_>>());
    }
    let ingress: Vec<Value> = (0..rng.below(3))
        .map(|_| {
            json!({"ip": opt(rng.chance(80).then(|| addr(rng))),
                   "ipMode": opt(rng.chance(60).then(|| rng.pick(&["VIP", "Proxy"]))),
                   "hostname": "lb.example.com", "ports": [{"port": 53, "protocol": "UDP"}]})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": meta(rng, ns, name, None),
        "spec": if rng.chance(95) { spec } else { Value::Null },
        "status": {"loadBalancer": {"ingress": ingress},
                   "conditions": [{"type": "x", "status": "True", "reason": "r", "message": "m",
                                   "lastTransitionTime": "2026-11-25T18:00:00Z"}]},
    }))
    .expect("a generated Service parses")
}

pub(in crate::conntrack) fn slice(
    rng: &mut Rng,
    ns: &str,
    name: &str,
    service: Option<&str>,
) -> EndpointSlice {
    let ports: Vec<Value> = (0..rng.below(4))
        .map(|_| {
            json!({"name": opt(rng.pick(&PORT_NAMES)), "protocol": opt(rng.pick(&PROTOCOLS)),
                   "port": opt(rng.chance(90).then(|| rng.pick(&[5353, 53, 0]))),
                   "appProtocol": "dns"})
        })
        .collect();
    let endpoints: Vec<Value> = (0..rng.below(5))
        .map(|i| {
            let cond = |rng: &mut Rng| opt(rng.chance(70).then(|| rng.chance(70)));
            json!({
                "addresses": (0..1 + rng.below(2)).map(|_| addr(rng)).collect::<Vec<_>>(),
                "conditions": if rng.chance(80) {
                    json!({"ready": cond(rng), "serving": cond(rng), "terminating": cond(rng)})
                } else { Value::Null },
                "nodeName": "node-1", "zone": "z", "hostname": format!("h{i}"),
                "hints": {"forZones": [{"name": "z"}]},
                "targetRef": {"kind": "Pod", "namespace": ns, "name": format!("p{i}"), "uid": "u"},
            })
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": meta(rng, ns, name, service),
        "addressType": rng.pick(&["IPv4", "IPv4", "IPv6", "FQDN"]),
        "ports": if rng.chance(90) { json!(ports) } else { Value::Null },
        "endpoints": endpoints,
    }))
    .expect("a generated EndpointSlice parses")
}

struct World {
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    cidrs: Vec<ServiceCIDR>,
    addresses: Vec<IPAddress>,
    node: Node,
}

fn world(seed: u64) -> World {
    let rng = &mut Rng(seed);
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for i in 0..1 + rng.below(6) {
        let ns = rng.pick(&NAMESPACES);
        let name = format!("s{i}");
        services.push(service(rng, ns, &name));
        for j in 0..rng.below(3) {
            // Mostly the service's own slices; some name another service, or none.
            let owner = match rng.below(10) {
                0 => None,
                1 => Some(format!("s{}", rng.below(6))),
                _ => Some(name.clone()),
            };
            slices.push(slice(rng, ns, &format!("{name}-{j}"), owner.as_deref()));
        }
    }
    let cidrs = (0..rng.below(3))
        .map(|i| {
            let c = rng.pick(&["10.96.0.0/16", "fd00:10:96::/112", "bad", "10.97.0.0/24"]);
            serde_json::from_value(json!({"metadata": meta(rng, "", &format!("c{i}"), None),
                "spec": {"cidrs": [c]},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "r",
                           "message": "", "lastTransitionTime": "2026-11-25T18:00:00Z"}]}}))
            .expect("a generated ServiceCIDR parses")
        })
        .collect();
    let addresses = (0..rng.below(4))
        .map(|_| {
            let a = addr(rng);
            serde_json::from_value(json!({"metadata": meta(rng, "", a, None),
                "spec": {"parentRef": {"group": "", "resource": "services", "namespace": "default", "name": "s0"}}}))
            .expect("a generated IPAddress parses")
        })
        .collect();
    let node = serde_json::from_value(json!({
        "metadata": meta(rng, "", "node-1", None),
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {"addresses": (0..rng.below(3)).map(|_| json!({"type": "InternalIP", "address": addr(rng)})).collect::<Vec<_>>(),
                   "capacity": {"cpu": "2"}, "nodeInfo": null},
    }))
    .expect("a generated Node parses");
    World {
        services,
        slices,
        cidrs,
        addresses,
        node,
    }
}

/// The model as the agent builds it: from the facts (`project`) of the objects as its watches
/// decode them (`wire.rs`).
fn model_of_views(w: &World) -> Model {
    model::reference::build(&w.services, &w.slices)
        .with_service_ips(&w.cidrs, &w.addresses)
        .with_node(Some(&w.node))
}

/// The model read straight from the whole objects (`reference::whole`, the reference).
fn model_of_whole(w: &World) -> Model {
    let m = whole::build(&w.services, &w.slices);
    let m = whole::with_service_ips(m, &w.cidrs, &w.addresses);
    whole::with_node(m, Some(&w.node))
}

#[test]
fn the_model_of_views_is_the_model_of_whole_objects() {
    let mut nonempty = 0;
    for seed in 0..3000 {
        let w = world(seed);
        let expected = model_of_whole(&w);
        assert_eq!(model_of_views(&w), expected, "seed {seed}");
        nonempty += usize::from(expected.iter().any(|(_, fm)| !fm.frontends.is_empty()));
    }
    // The generator must produce services the model keeps, or the check above proves nothing.
    assert!(
        nonempty > 500,
        "only {nonempty} of 3000 worlds had a frontend"
    );
}

#[test]
fn views_keep_only_what_the_model_reads() {
    // A TCP-only slice keeps no address at all.
    let tcp: WireSlice = serde_json::from_value(json!({
        "metadata": {"name": "t", "namespace": "d", "labels": {LABEL_SERVICE_NAME: "t"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.244.0.9"]}],
    }))
    .unwrap();
    let p = project::slice(&tcp);
    assert!(p.serving.is_empty() && p.ports.is_empty());
    assert_eq!(p.service.as_deref(), Some("t"));
    // A UDP slice keeps the serving addresses of its family, parsed, sorted, once each.
    let udp: WireSlice = serde_json::from_value(json!({
        "metadata": {"name": "u", "namespace": "d", "labels": {LABEL_SERVICE_NAME: "u"}},
        "addressType": "IPv4",
        "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                  {"name": "dns-tcp", "port": 53, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.244.0.5"]},
                      {"addresses": ["10.244.0.2"], "conditions": {"serving": false}},
                      {"addresses": ["10.244.0.3", "010.244.0.04"], "conditions": {"ready": false, "serving": true}},
                      {"addresses": ["10.244.0.1", "fd00::1", "10.244.0.5"], "conditions": {"ready": false}}],
    }))
    .unwrap();
    let p = project::slice(&udp);
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    assert_eq!(
        &*p.serving,
        ["10.244.0.1", "10.244.0.3", "10.244.0.4", "10.244.0.5"].map(ip)
    );
    assert_eq!(&*p.ports, [("dns".into(), Some(53))]);
    // Another proxy's slice, and a headless service's, are never read.
    for label in [LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS] {
        let mut s = udp.clone();
        s.metadata
            .labels
            .get_or_insert_default()
            .insert(label.into(), "x".into());
        assert_eq!(
            project::slice(&s),
            project::SliceFacts::default(),
            "{label}"
        );
    }
    // A Service keeps its frontend IPs per family and its UDP ports, nothing else.
    let svc: WireService = serde_json::from_value(json!({
        "metadata": {"name": "s", "namespace": "d", "labels": {"app": "x"}},
        "spec": {"clusterIPs": ["10.96.0.10", "fd00:10:96::a"], "externalIPs": ["192.0.2.1"],
                 "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
                           {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]},
    }))
    .unwrap();
    let v = project::service(&svc);
    assert!(!v.foreign);
    assert_eq!(&*v.ips[Family::V4], ["10.96.0.10", "192.0.2.1"].map(ip));
    assert_eq!(&*v.ips[Family::V6], ["fd00:10:96::a"].map(ip));
    assert_eq!(v.ports.len(), 1);
    assert_eq!(
        (&*v.ports[0].name, v.ports[0].port, v.ports[0].node_port),
        ("dns", 53, Some(30053))
    );
}
