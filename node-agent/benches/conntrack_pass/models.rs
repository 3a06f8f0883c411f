//! The service models the passes judge by: the table's services, the model before a change, and
//! the changes a triggered pass is measured after (an endpoint added or removed, a NodePort
//! service, many services), with the filtered dumps of each change's scope.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use crate::table::{SERVICES, ip};
use groundskeeper_node_agent::conntrack::model::focus::Scope;
use groundskeeper_node_agent::conntrack::model::{self, FamilyModel, Model};
use groundskeeper_node_agent::conntrack::netlink::filter::Select;
use groundskeeper_node_agent::conntrack::pass::PassState;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

/// Every service's serving endpoints 10.244.{0,1,2}.s:53 but the `removed` ones.
pub(crate) fn model_without(removed: &[u8]) -> FamilyModel {
    let mut m = FamilyModel::default();
    for s in 0..SERVICES as u8 {
        let serving = (0..3)
            .filter(|ep| !removed.contains(ep))
            .map(|ep| SocketAddr::new(ip(10, 244, ep, s), 53))
            .collect();
        m.frontends
            .insert(SocketAddr::new(ip(10, 96, 0, s), 53), serving);
    }
    m
}

pub(crate) fn model() -> FamilyModel {
    model_without(&[])
}

/// A pass's state after the agent saw `old` become `new` (the flows to backends that stopped
/// serving go at once; to any other not-serving backend they would wait the grace).
pub(crate) fn seen(old: &FamilyModel, new: &FamilyModel) -> PassState {
    let mut state = PassState::default();
    state.graces.removed.observe(old, new, Instant::now());
    state
}

/// What every service served before the bench's stale flows went stale: 10.244.{0,1,2,99}.s.
pub(crate) fn model_before() -> FamilyModel {
    let mut m = model();
    for (f, serving) in &mut m.frontends {
        if let IpAddr::V4(v4) = f.ip() {
            serving.extend([&SocketAddr::new(ip(10, 244, 99, v4.octets()[3]), 53)]);
        }
    }
    m
}

/// The changes a triggered pass is measured after: (what, per changed service, its endpoints
/// after the change: `ep` octets of 10.244.ep.svc; before, every service has 0, 1, 2 and 99).
/// The `bench` line of "1 service, an endpoint removed" is `triggered_pass_ratio_<scale>`;
/// the others carry their key.
pub(crate) fn changes() -> Vec<(&'static str, &'static str, Vec<Endpoints>)> {
    vec![
        (
            "1 service, an endpoint added:",
            "_added",
            vec![(0, vec![0, 1, 2, 99, 5])],
        ),
        (
            "1 service, an endpoint removed:",
            "",
            vec![(10, vec![0, 1, 2])],
        ),
        (
            "1 NodePort service, an endpoint removed:",
            "_node_port",
            vec![(NODE_PORT_SERVICE, vec![0, 1, 2])],
        ),
        (
            "16 services, an endpoint removed each:",
            "_16_services",
            (20..36).map(|s| (s, vec![0, 1, 2])).collect(),
        ),
    ]
}

/// A service (by number) and its endpoints (octets of 10.244.ep.svc).
pub(crate) type Endpoints = (u8, Vec<u8>);

/// The service with a nodePort (30000 + its number).
pub(crate) const NODE_PORT_SERVICE: u8 = 40;

/// The model of the bench's 100 UDP services (ClusterIP 10.96.0.s:53, endpoints 10.244.{0,1,2,99}.s:53)
/// with `changed` services' endpoints replaced, built as the agent builds it.
pub(crate) fn services_model(changed: &[Endpoints]) -> Model {
    let mut objects: Vec<(Service, EndpointSlice)> = Vec::new();
    for s in 0..SERVICES as u8 {
        let eps = changed
            .iter()
            .find(|(c, _)| *c == s)
            .map_or(vec![0, 1, 2, 99], |(_, e)| e.clone());
        let node_port = (s == NODE_PORT_SERVICE).then_some(30000 + u16::from(s));
        let svc = serde_json::from_value(json!({
            "metadata": {"namespace": "bench", "name": format!("s{s}")},
            "spec": {"clusterIP": format!("10.96.0.{s}"),
                     "ports": [{"port": 53, "protocol": "UDP", "nodePort": node_port}]},
        }))
        .unwrap();
        let slice = serde_json::from_value(json!({
            "metadata": {"namespace": "bench", "name": format!("s{s}-1"),
                         "labels": {"kubernetes.io/service-name": format!("s{s}")}},
            "addressType": "IPv4",
            "ports": [{"port": 53, "protocol": "UDP"}],
            "endpoints": eps.iter().map(|e| json!({"addresses": [format!("10.244.{e}.{s}")]})).collect::<Vec<_>>(),
        }))
        .unwrap();
        objects.push((svc, slice));
    }
    model::reference::build(
        objects.iter().map(|(s, _)| s),
        objects.iter().map(|(_, e)| e),
    )
}

/// Every kernel selection of the scope's entries, the frontend's first (what the triggered pass
/// would ask for with no limit on the number of dumps).
pub(crate) fn scope_selections(scope: &Scope) -> Vec<Select> {
    let mut out: Vec<Select> = scope
        .frontends
        .iter()
        .filter_map(|f| match f.ip() {
            IpAddr::V4(ip) => Some(Select::OrigDst(ip, f.port())),
            IpAddr::V6(_) => None,
        })
        .collect();
    out.sort();
    out.extend(scope.node_ports.iter().map(|p| Select::OrigDstPort(*p)));
    out.extend(scope.backends.iter().filter_map(|b| match b {
        IpAddr::V4(ip) => Some(Select::ReplySource(*ip)),
        IpAddr::V6(_) => None,
    }));
    out
}
