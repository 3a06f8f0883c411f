//! Builds the per-family service model from Services and EndpointSlices, feeding it the way
//! kube-proxy's service and endpoint trackers feed CleanStaleEntries (spec 3.2, last part).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::clean::{FamilyModel, Model, canonical};

pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// kube-proxy (run without a proxy name) ignores Services and EndpointSlices carrying it.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Set by the EndpointSlice controller on slices of headless Services.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn holds(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_))
        )
    }

    fn address_type(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

fn has_label(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> bool {
    meta.labels.as_ref().is_some_and(|l| l.contains_key(key))
}

/// Parses an address as kube-proxy would use it; mapped IPv6 compares as IPv4 (like Go's
/// `net.IP.String()`), so the family check uses the canonical form. Like `ParseIPSloppy`,
/// IPv4 octets with leading zeros are read as decimal (objects validated by older apiservers
/// may hold them): dropping such an endpoint would make its live flows look stale.
fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| parse_ipv4_leading_zeros(s))
        .map(canonical)
}

fn parse_ipv4_leading_zeros(s: &str) -> Option<IpAddr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let p = parts.next()?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    parts.next().is_none().then(|| IpAddr::from(octets))
}

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
    for slice in slices
        .iter()
        .filter(|s| s.address_type == fam.address_type())
    {
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
            // kube-proxy uses an endpoint's first address only.
            let ip = ep.addresses.first().and_then(|a| parse_ip(a));
            if let Some(ip) = ip.filter(|ip| serving && fam.holds(ip)) {
                out.insert(SocketAddr::new(ip, ep_port));
            }
        }
    }
    out
}

fn build_family(
    services: &[&Service],
    slices: &HashMap<(&str, &str), Vec<&EndpointSlice>>,
    fam: Family,
) -> FamilyModel {
    let mut m = FamilyModel::default();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        let cluster_ips: Vec<&str> = match &spec.cluster_ips {
            Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
            _ => spec.cluster_ip.as_deref().into_iter().collect(),
        };
        let Some(cluster_ip) = cluster_ips
            .iter()
            .filter_map(|ip| parse_ip(ip))
            .find(|ip| fam.holds(ip))
        else {
            continue; // headless ("None"), unallocated, or no IP of this family
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

        let ns = svc.metadata.namespace.as_deref().unwrap_or("");
        let name = svc.metadata.name.as_deref().unwrap_or("");
        let svc_slices = slices.get(&(ns, name)).map(Vec::as_slice).unwrap_or(&[]);
        for port in spec.ports.iter().flatten() {
            if protocol(&port.protocol) != "UDP" {
                continue;
            }
            let Some(svc_port) = valid_port(port.port) else {
                continue;
            };
            let serving = serving_endpoints(svc_slices, port, fam);
            if serving.is_empty() {
                continue; // v1.36: no cleanup for a port without serving endpoints
            }
            for ip in &frontend_ips {
                m.frontends
                    .insert(SocketAddr::new(*ip, svc_port), serving.clone());
            }
            if let Some(np) = port.node_port.and_then(valid_port) {
                m.node_ports.insert(np, serving);
            }
        }
    }
    m
}

/// Builds both families' models. Services are visited in namespace/name order, so when two
/// write the same frontend the later one wins deterministically.
pub fn build<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Model {
    let mut by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for s in slices {
        if has_label(&s.metadata, LABEL_SERVICE_PROXY_NAME)
            || has_label(&s.metadata, LABEL_HEADLESS)
        {
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
    let mut services: Vec<&Service> = services
        .into_iter()
        .filter(|s| !has_label(&s.metadata, LABEL_SERVICE_PROXY_NAME))
        .filter(|s| {
            s.spec
                .as_ref()
                .is_some_and(|sp| sp.type_.as_deref() != Some("ExternalName"))
        })
        .collect();
    services.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    Model {
        ipv4: build_family(&services, &by_service, Family::V4),
        ipv6: build_family(&services, &by_service, Family::V6),
    }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
