//! The model read straight from whole Services, EndpointSlices, ServiceCIDRs, IPAddresses
//! and the Node, field by field as kube-proxy reads them: the reference the facts
//! (`project.rs`) are checked against. `project_tests.rs` checks that the model built from
//! facts equals this one over generated objects; nothing else uses it.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{Node, Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};

use crate::conntrack::model::addr::parse_ip;
use crate::conntrack::model::{
    Claim, FamilyModel, LABEL_SERVICE_NAME, Model, ServiceIpRange, not_kube_proxys,
};
use crate::conntrack::netlink::family::{Family, PerFamily};

fn protocol(p: &Option<String>) -> &str {
    p.as_deref().unwrap_or("TCP")
}

fn port_name(p: &Option<String>) -> &str {
    p.as_deref().unwrap_or("")
}

fn valid_port(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|p| *p != 0)
}

/// The serving endpoints `IP:port` of one UDP service port in one family.
fn serving_endpoints(
    slices: &[&EndpointSlice],
    port: &ServicePort,
    fam: Family,
) -> HashSet<SocketAddr> {
    let mut out = HashSet::new();
    for slice in slices.iter().filter(|s| s.address_type == fam.label()) {
        let ep_port = slice.ports.iter().flatten().find(|p| {
            port_name(&p.name) == port_name(&port.name) && protocol(&p.protocol) == "UDP"
        });
        let Some(ep_port) = ep_port.and_then(|p| p.port).and_then(valid_port) else {
            continue;
        };
        for ep in &slice.endpoints {
            let serving = ep
                .conditions
                .as_ref()
                .and_then(|c| c.serving)
                .unwrap_or(true);
            if !serving {
                continue;
            }
            // Every address counts (kube-proxy uses only the first): a flow DNATed to any of
            // them may be live, and judging it stale would cut it.
            for ip in ep.addresses.iter().filter_map(|a| parse_ip(a)) {
                if fam.holds(&ip) {
                    out.insert(SocketAddr::new(ip, ep_port));
                }
            }
        }
    }
    out
}

/// The UDP frontends (`IP:port`) and nodePorts of one service in one family, each with the
/// service port it belongs to.
fn udp_frontends(svc: &Service, fam: Family) -> Vec<(&ServicePort, Vec<SocketAddr>, Option<u16>)> {
    let mut out = Vec::new();
    let Some(spec) = &svc.spec else { return out };
    let cluster_ips: Vec<&str> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.as_deref().into_iter().collect(),
    };
    let Some(cluster_ip) = cluster_ips
        .iter()
        .filter_map(|ip| parse_ip(ip))
        .find(|ip| fam.holds(ip))
    else {
        return out; // headless ("None"), unallocated, or no IP of this family
    };
    let external_ips = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|s| parse_ip(s));
    let lb_vips = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter(|i| i.ip_mode.as_deref().is_none_or(|m| m == "VIP"))
        .filter_map(|i| i.ip.as_deref().and_then(parse_ip));
    let frontend_ips: Vec<IpAddr> = std::iter::once(cluster_ip)
        .chain(external_ips)
        .chain(lb_vips)
        .filter(|ip| fam.holds(ip))
        .collect();
    for port in spec.ports.iter().flatten() {
        if protocol(&port.protocol) != "UDP" {
            continue;
        }
        let Some(svc_port) = valid_port(port.port) else {
            continue;
        };
        let frontends = frontend_ips
            .iter()
            .map(|ip| SocketAddr::new(*ip, svc_port))
            .collect();
        out.push((port, frontends, port.node_port.and_then(valid_port)));
    }
    out
}

fn build_family(
    services: &[&Service],
    foreign: &[&Service],
    slices: &HashMap<(&str, &str), Vec<&EndpointSlice>>,
    fam: Family,
) -> FamilyModel {
    let mut m = FamilyModel::default();
    for svc in foreign {
        for (_, frontends, node_port) in udp_frontends(svc, fam) {
            m.foreign_frontends.extend(frontends);
            m.foreign_node_ports.extend(node_port);
        }
    }
    for svc in services {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("");
        let name = svc.metadata.name.as_deref().unwrap_or("");
        let svc_slices = slices.get(&(ns, name)).map(Vec::as_slice).unwrap_or(&[]);
        for (port, frontends, node_port) in udp_frontends(svc, fam) {
            // No serving endpoint (or no slice port matching this one) is an empty set: every
            // flow through the frontend is stale (kubernetes#139629), once that has held for
            // the settle time (`Settle`). Several services claiming one frontend: the union,
            // never the last one's set alone (a Service declaring kube-dns's ClusterIP as an
            // ExternalIP must not make every DNS flow stale).
            let serving = serving_endpoints(svc_slices, port, fam);
            for f in &frontends {
                m.frontends.entry(*f).or_default().extend(&serving);
            }
            if let Some(np) = node_port {
                m.node_ports.entry(np).or_default().extend(&serving);
            }
            m.services
                .entry(format!("{ns}/{name}"))
                .or_default()
                .insert(
                    port_name(&port.name),
                    Claim {
                        frontends: frontends.into_iter().collect(),
                        node_port,
                        serving: serving.into_iter().collect(),
                        settling: false,
                    },
                );
        }
    }
    m
}

/// Builds both families' models. Services claiming the same frontend or nodePort share it:
/// its serving set is the union of theirs. Services labelled with a proxy name are another
/// proxy's: their frontends are recorded as foreign (never judged). Every service port without
/// a serving endpoint is judged at once (an empty set); [`Settle`] holds them back for a while.
pub fn build<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Model {
    let mut by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for s in slices {
        if not_kube_proxys(&s.metadata) {
            continue;
        }
        let Some(svc) = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE_NAME))
        else {
            continue;
        };
        let ns = s.metadata.namespace.as_deref().unwrap_or("");
        by_service.entry((ns, svc.as_str())).or_default().push(s);
    }
    let (mut foreign, mut services): (Vec<&Service>, Vec<&Service>) = services
        .into_iter()
        .filter(|s| {
            s.spec
                .as_ref()
                .is_some_and(|sp| sp.type_.as_deref() != Some("ExternalName"))
        })
        .partition(|s| not_kube_proxys(&s.metadata));
    let by_name = |a: &&Service, b: &&Service| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    };
    services.sort_by(by_name);
    foreign.sort_by(by_name);
    PerFamily(Family::ALL.map(|f| build_family(&services, &foreign, &by_service, f)))
}

/// Adds the ServiceCIDR prefixes and the IPs IPAddress objects hold.
pub fn with_service_ips<'a>(
    mut m: Model,
    cidrs: impl IntoIterator<Item = &'a ServiceCIDR>,
    addresses: impl IntoIterator<Item = &'a IPAddress>,
) -> Model {
    for c in cidrs {
        for cidr in c
            .spec
            .as_ref()
            .and_then(|s| s.cidrs.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|s| ServiceIpRange::parse(s))
        {
            let fm = &mut m[Family::of(cidr.addr)];
            if !fm.service_cidrs.contains(&cidr) {
                fm.service_cidrs.push(cidr);
            }
        }
    }
    for a in addresses {
        if let Some(ip) = a.metadata.name.as_deref().and_then(parse_ip) {
            m[Family::of(ip)].allocated.insert(ip);
        }
    }
    for fm in &mut m.0 {
        fm.service_cidrs.sort();
    }
    m
}

/// Adds the addresses of this node's Node object.
pub fn with_node(mut m: Model, node: Option<&Node>) -> Model {
    let addrs = node
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|a| parse_ip(&a.address));
    for ip in addrs {
        m[Family::of(ip)].node_ips.insert(ip);
    }
    m
}
