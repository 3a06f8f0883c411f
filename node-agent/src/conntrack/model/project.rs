//! What of each watched object the cleanup keeps: the fields the model reads, parsed, in types
//! of our own.
//!
//! At Kubernetes' documented limits (10k Services, 100k endpoints) whole objects cost the agent
//! hundreds of MiB on every node, and even k8s-openapi structs cut down to a few fields cost
//! several hundred bytes each (ObjectMeta, ServiceSpec) plus a string per address. Each object
//! is turned into its facts as it arrives from the watch, before it is stored, straight from the
//! type the watch decodes (`wire.rs` for Services, EndpointSlices and IPAddresses; k8s-openapi's
//! for ServiceCIDRs and the Node): a Service into its frontend IPs per family and its UDP ports,
//! an EndpointSlice into its UDP ports and the parsed addresses of its serving endpoints. The
//! rule: the model built from facts equals the model built from whole objects (`project_tests.rs`
//! checks it over generated objects, each decoded as the watch decodes it, against
//! `reference::whole`, the reading of whole objects), so a field the model starts to read must be
//! kept here, and decoded in `wire.rs`, too.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::addr::{ServiceIpRange, parse_ip};
use crate::conntrack::netlink::family::{Family, PerFamily};
use crate::conntrack::wire::{WireIpAddress, WireService, WireSlice};

pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// kube-proxy (run without a proxy name) ignores Services and EndpointSlices carrying it.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Set by the EndpointSlice controller on slices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";

/// kube-proxy watches Services and EndpointSlices through one informer factory filtered by
/// `!service-proxy-name,!headless`: a Service or slice with either label is not kube-proxy's,
/// whatever its spec says (a Service labelled headless by hand, with a ClusterIP, gets no rules).
pub fn not_kube_proxys(meta: &ObjectMeta) -> bool {
    has_label(meta, LABEL_SERVICE_PROXY_NAME) || has_label(meta, LABEL_HEADLESS)
}

/// A Service as the model reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceFacts {
    /// Labelled for another proxy (`service-proxy-name`): its frontends are foreign.
    pub foreign: bool,
    /// Per family, the frontend IPs: the ClusterIP first, then the ExternalIPs and
    /// load-balancer VIPs of that family. None without a ClusterIP of the family (headless,
    /// unallocated), and none for an ExternalName Service or one without a spec.
    pub ips: PerFamily<Box<[IpAddr]>>,
    /// The UDP ports with a valid port number, in spec order.
    pub ports: Box<[UdpPort]>,
}

/// A UDP service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpPort {
    /// "" when unnamed.
    pub name: Box<str>,
    pub port: u16,
    pub node_port: Option<u16>,
}

/// An EndpointSlice as the model reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceFacts {
    /// Its `kubernetes.io/service-name` label; `None` for a slice the model never reads (no
    /// such label, another proxy's, a headless Service's).
    pub service: Option<Box<str>>,
    /// The UDP ports in order, by name: the port, `None` when unset or invalid (the model takes
    /// the first port of a name, so such a port still hides a later one of the same name).
    pub ports: Box<[(Box<str>, Option<u16>)]>,
    /// The addresses of its serving endpoints (an unset `serving` serves) that are of its
    /// address type, parsed, sorted, without repeats. None for a slice without a UDP port (none
    /// of them can be a backend of a UDP flow) or of another address type (FQDN).
    pub serving: Box<[IpAddr]>,
}

fn has_label(meta: &ObjectMeta, key: &str) -> bool {
    meta.labels.as_ref().is_some_and(|l| l.contains_key(key))
}

fn is_udp(protocol: &Option<String>) -> bool {
    protocol.as_deref() == Some("UDP")
}

fn valid_port(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|p| *p != 0)
}

/// A Service: its frontend IPs per family, UDP ports, and whether it is kube-proxy's.
pub fn service(s: &WireService) -> ServiceFacts {
    let foreign = not_kube_proxys(&s.metadata);
    let Some(spec) = s
        .spec
        .as_ref()
        .filter(|sp| sp.type_.as_deref() != Some("ExternalName"))
    else {
        return ServiceFacts {
            foreign,
            ..ServiceFacts::default()
        };
    };
    let cluster_ips: Vec<&str> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.as_deref().into_iter().collect(),
    };
    let external_ips: Vec<IpAddr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|s| parse_ip(s))
        .collect();
    // An ingress without ipMode is a VIP; "Proxy" sends traffic to the load balancer instead.
    let lb_vips: Vec<IpAddr> = s
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter(|i| i.ip_mode.as_deref().is_none_or(|m| m == "VIP"))
        .filter_map(|i| i.ip.as_deref().and_then(parse_ip))
        .collect();
    let ips = PerFamily(Family::ALL.map(|fam| {
        let Some(cluster_ip) = cluster_ips
            .iter()
            .filter_map(|ip| parse_ip(ip))
            .find(|ip| fam.holds(ip))
        else {
            return Box::default();
        };
        std::iter::once(cluster_ip)
            .chain(external_ips.iter().copied())
            .chain(lb_vips.iter().copied())
            .filter(|ip| fam.holds(ip))
            .collect()
    }));
    let ports = if ips.0.iter().all(|i| i.is_empty()) {
        Box::default() // no frontend in any family: no port is ever read
    } else {
        spec.ports
            .iter()
            .flatten()
            .filter(|p| is_udp(&p.protocol))
            .filter_map(|p| {
                Some(UdpPort {
                    name: p.name.as_deref().unwrap_or("").into(),
                    port: valid_port(p.port)?,
                    node_port: p.node_port.and_then(valid_port),
                })
            })
            .collect()
    };
    ServiceFacts {
        foreign,
        ips,
        ports,
    }
}

/// An EndpointSlice: its Service, UDP ports and serving addresses.
pub fn slice(s: &WireSlice) -> SliceFacts {
    let meta = &s.metadata;
    let service = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_NAME))
        .filter(|_| !not_kube_proxys(meta));
    let family = Family::ALL
        .into_iter()
        .find(|f| s.address_type == f.label());
    let (Some(service), Some(family)) = (service, family) else {
        return SliceFacts::default();
    };
    let ports: Box<[(Box<str>, Option<u16>)]> = s
        .ports
        .iter()
        .flatten()
        .filter(|p| is_udp(&p.protocol))
        .map(|p| {
            (
                p.name.as_deref().unwrap_or("").into(),
                p.port.and_then(valid_port),
            )
        })
        .collect();
    let mut serving: Vec<IpAddr> = Vec::new();
    if !ports.is_empty() {
        for e in &s.endpoints {
            if e.conditions
                .as_ref()
                .and_then(|c| c.serving)
                .unwrap_or(true)
            {
                // Every address counts (kube-proxy uses only the first): a flow DNATed to any
                // of them may be live, and judging it stale would cut it.
                serving.extend(
                    e.addresses
                        .iter()
                        .filter_map(|a| parse_ip(a))
                        .filter(|ip| family.holds(ip)),
                );
            }
        }
    }
    serving.sort_unstable();
    serving.dedup();
    SliceFacts {
        service: Some(service.as_str().into()),
        ports,
        serving: serving.into(),
    }
}

/// A ServiceCIDR: its prefixes that parse.
pub fn service_cidr(c: &ServiceCIDR) -> Box<[ServiceIpRange]> {
    c.spec
        .as_ref()
        .and_then(|s| s.cidrs.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| ServiceIpRange::parse(s))
        .collect()
}

/// An IPAddress: its name is the IP; `None` when it does not parse.
pub fn ip_address(a: &WireIpAddress) -> Option<IpAddr> {
    a.metadata.name.as_deref().and_then(parse_ip)
}

/// This node: its addresses that are IPs.
pub fn node(n: &Node) -> Box<[IpAddr]> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|a| parse_ip(&a.address))
        .collect()
}
