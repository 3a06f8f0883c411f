//! A UDP Service with one EndpointSlice of its own: the frontend/backends pair whose flows the
//! conntrack tests put in a table and watch the agent clean up.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use crate::Cluster;

/// The port the Service listens on; flows in the tests are DNATed from it.
pub const SERVICE_PORT: u16 = 53;
/// The port of every endpoint in the Service's slice.
pub const ENDPOINT_PORT: u16 = 5353;

/// Creates Service `ns/name` (UDP port 53, ClusterIP allocated by the apiserver) and one IPv4
/// EndpointSlice `<name>-1` on port 5353 holding `endpoints`, both tracked for cleanup.
/// Returns the ClusterIP the apiserver allocated: the caller decides what an IPv6 one means.
pub async fn udp_service(
    c: &Cluster,
    ns: &str,
    name: &str,
    endpoints: &[&str],
) -> anyhow::Result<IpAddr> {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"ports": [{"name": "dns", "port": SERVICE_PORT, "protocol": "UDP"}]},
    }))?;
    let svc = c.create(&svc).await?;
    let ip: IpAddr = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| anyhow::anyhow!("no clusterIP allocated"))?
        .parse()?;
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": format!("{name}-1"),
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "dns", "port": ENDPOINT_PORT, "protocol": "UDP"}],
        "endpoints": endpoint_list(endpoints),
    }))?;
    c.create(&slice).await?;
    Ok(ip)
}

/// The `endpoints` field of a slice holding one ready address per entry of `ips`: also what a
/// test patches in to scale the slice down.
pub fn endpoint_list(ips: &[impl AsRef<str>]) -> serde_json::Value {
    ips.iter()
        .map(|ip| json!({"addresses": [ip.as_ref()]}))
        .collect()
}

/// Creates Service `ns/name` from `spec` (merged over a dual-stack UDP port 53 named `dns`), and
/// returns it as the apiserver stored it (ClusterIPs and nodePorts allocated), tracked for
/// cleanup.
pub async fn dual_stack_service(
    c: &Cluster,
    ns: &str,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<Service> {
    let mut full = json!({
        "ipFamilyPolicy": "RequireDualStack",
        "ipFamilies": ["IPv4", "IPv6"],
        "ports": [{"name": "dns", "port": SERVICE_PORT, "protocol": "UDP"}],
    });
    if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        full.extend(extra.clone());
    }
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": full,
    }))?;
    c.create(&svc).await
}

/// The ClusterIPs of a stored Service, in its families' order.
pub fn cluster_ips(svc: &Service) -> Vec<IpAddr> {
    svc.spec
        .as_ref()
        .and_then(|s| s.cluster_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The nodePort allocated to a stored Service's first port.
pub fn node_port(svc: &Service) -> Option<u16> {
    svc.spec
        .as_ref()?
        .ports
        .as_ref()?
        .first()?
        .node_port
        .and_then(|p| u16::try_from(p).ok())
}

/// An EndpointSlice `<svc>-<family>` of Service `ns/svc` on UDP port 5353 named `port_name`,
/// holding one serving address per entry of `ips` (their family decides `addressType`; an
/// empty list is IPv4).
pub fn slice(ns: &str, svc: &str, port_name: &str, ips: &[&str]) -> anyhow::Result<EndpointSlice> {
    let family = if ips.first().is_some_and(|i| i.contains(':')) {
        "IPv6"
    } else {
        "IPv4"
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": format!("{svc}-{}", family.to_lowercase()),
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": family,
        "ports": [{"name": port_name, "port": ENDPOINT_PORT, "protocol": "UDP"}],
        "endpoints": endpoint_list(ips),
    }))?)
}
