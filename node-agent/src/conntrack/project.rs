//! What of each watched object the cleanup keeps: the fields the model reads, nothing else.
//!
//! At Kubernetes' documented limits (10k Services, 100k endpoints) whole objects cost the agent
//! hundreds of MiB (managedFields, annotations, targetRefs, topology, TCP ports), on every node.
//! Each object is cut down as it arrives from the watch, before it is stored. The rule: the model
//! built from projected objects equals the model built from whole ones (`project_tests.rs`
//! checks it over generated objects), so a field the model starts to read must be kept here too.

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeStatus, Service, ServicePort,
    ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR, ServiceCIDRSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::model::{LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME};

/// Name, namespace and the labels among `keep`; everything else of the metadata goes.
fn meta(m: ObjectMeta, keep: &[&str]) -> ObjectMeta {
    let labels = m.labels.map(|mut l| {
        l.retain(|k, _| keep.contains(&k.as_str()));
        l
    });
    ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        labels: labels.filter(|l| !l.is_empty()),
        ..ObjectMeta::default()
    }
}

fn is_udp(protocol: &Option<String>) -> bool {
    protocol.as_deref() == Some("UDP")
}

/// A Service: its type, IPs, UDP ports and load-balancer VIPs; the proxy-name label.
pub fn service(s: Service) -> Service {
    let spec = s.spec.map(|sp| ServiceSpec {
        type_: sp.type_,
        cluster_ip: sp.cluster_ip,
        cluster_ips: sp.cluster_ips,
        external_ips: sp.external_ips,
        // Only UDP ports have flows to clean; TCP is never judged.
        ports: sp.ports.map(|ps| {
            ps.into_iter()
                .filter(|p| is_udp(&p.protocol))
                .map(|p| ServicePort {
                    name: p.name,
                    port: p.port,
                    protocol: p.protocol,
                    node_port: p.node_port,
                    ..ServicePort::default()
                })
                .collect()
        }),
        ..ServiceSpec::default()
    });
    let ingress = s
        .status
        .and_then(|st| st.load_balancer)
        .and_then(|lb| lb.ingress)
        .map(|is| {
            is.into_iter()
                .map(|i| LoadBalancerIngress {
                    ip: i.ip,
                    ip_mode: i.ip_mode,
                    ..LoadBalancerIngress::default()
                })
                .collect::<Vec<_>>()
        });
    Service {
        metadata: meta(s.metadata, &[LABEL_SERVICE_PROXY_NAME]),
        spec,
        status: ingress.map(|ingress| ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(ingress),
            }),
            ..ServiceStatus::default()
        }),
    }
}

/// An EndpointSlice: its service, family and UDP ports, and the addresses of its serving
/// endpoints, all in one endpoint. The model asks of a slice only which addresses serve (an
/// endpoint whose `serving` is unset serves), so one endpoint holding every serving address
/// says the same as a hundred, for a tenth of the memory. A slice without a UDP port keeps no
/// address: none of them can be a backend of a UDP flow.
pub fn slice(s: EndpointSlice) -> EndpointSlice {
    let ports: Option<Vec<EndpointPort>> = s.ports.map(|ps| {
        ps.into_iter()
            .filter(|p| is_udp(&p.protocol))
            .map(|p| EndpointPort {
                name: p.name,
                port: p.port,
                protocol: p.protocol,
                ..EndpointPort::default()
            })
            .collect()
    });
    let mut serving: Vec<String> = Vec::new();
    if ports.as_ref().is_some_and(|p| !p.is_empty()) {
        for e in s.endpoints {
            if e.conditions.and_then(|c| c.serving).unwrap_or(true) {
                serving.extend(e.addresses);
            }
        }
    }
    serving.shrink_to_fit();
    let endpoints = if serving.is_empty() {
        Vec::new()
    } else {
        vec![Endpoint {
            addresses: serving,
            ..Endpoint::default()
        }]
    };
    EndpointSlice {
        metadata: meta(
            s.metadata,
            &[LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS],
        ),
        address_type: s.address_type,
        ports,
        endpoints,
    }
}

/// A ServiceCIDR: its prefixes.
pub fn service_cidr(c: ServiceCIDR) -> ServiceCIDR {
    ServiceCIDR {
        metadata: meta(c.metadata, &[]),
        spec: c.spec.map(|s| ServiceCIDRSpec { cidrs: s.cidrs }),
        status: None,
    }
}

/// An IPAddress: its name is the IP.
pub fn ip_address(a: IPAddress) -> IPAddress {
    IPAddress {
        metadata: meta(a.metadata, &[]),
        spec: None,
    }
}

/// This node: its addresses.
pub fn node(n: Node) -> Node {
    Node {
        metadata: meta(n.metadata, &[]),
        spec: None,
        status: n
            .status
            .and_then(|s| s.addresses)
            .map(|addresses| NodeStatus {
                addresses: Some(
                    addresses
                        .into_iter()
                        .map(|a| NodeAddress {
                            address: a.address,
                            type_: a.type_,
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
    }
}
