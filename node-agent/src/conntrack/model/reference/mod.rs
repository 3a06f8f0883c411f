//! The reference definitions of the model, for tests and benches only (never in the binary):
//! the model built from scratch from the facts (`build_facts`, `build` from whole objects
//! decoded as the watches decode them, `slim`), the deleted frontends remembered from one build
//! to the next (`Tombstones`), the settle before the zero-endpoint rule (`Settle`), and
//! `whole`, the model read straight from whole objects. Production keeps `Live`, which `live_tests.rs` checks equals `build_facts` then
//! `Settle` then `Tombstones` after every update; `project_tests.rs` checks the facts against
//! `whole`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::project::{self, ServiceFacts, SliceFacts};
use super::{Claim, FamilyModel, Model, ServiceIpRange, port_claims};
use crate::conntrack::netlink::family::{Family, PerFamily};
use crate::conntrack::wire::{WireIpAddress, WireService, WireSlice};

/// `whole` as the apiserver sends it, decoded as the watch decodes it: a whole Service,
/// EndpointSlice or IPAddress into its wire type (`wire.rs`).
pub fn slim<W: DeserializeOwned>(whole: &impl Serialize) -> W {
    serde_json::from_value(serde_json::to_value(whole).expect("serializes"))
        .expect("the slim type decodes what the whole one encodes")
}

/// `namespace/name`, the key of [`FamilyModel::services`].
pub fn service_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// Adds one service's claims to `m` (see [`build_facts`]).
fn add_service(
    m: &mut FamilyModel,
    key: &str,
    svc: &ServiceFacts,
    slices: &[&SliceFacts],
    fam: Family,
) {
    if svc.foreign {
        for (_, c) in port_claims(svc, &[], fam) {
            m.foreign_frontends.extend(&c.frontends);
            m.foreign_node_ports.extend(c.node_port);
        }
        return;
    }
    for (port, claim) in port_claims(svc, slices, fam) {
        // Several services claiming one frontend: the union, never the last one's set alone
        // (a Service declaring kube-dns's ClusterIP as an ExternalIP must not make every DNS
        // flow stale).
        for f in &claim.frontends {
            m.frontends.entry(*f).or_default().extend(&claim.serving);
        }
        if let Some(np) = claim.node_port {
            m.node_ports.entry(np).or_default().extend(&claim.serving);
        }
        // A repeated port name: the last one's claim is recorded, every one's frontends count.
        m.services
            .entry(key.to_string())
            .or_default()
            .insert(port, claim);
    }
}

/// Builds both families' models from the facts of every Service (namespace, name, facts) and
/// EndpointSlice (namespace, facts). Services claiming the same frontend or nodePort share it:
/// its serving set is the union of theirs. Services labelled with a proxy name are another
/// proxy's: their frontends are recorded as foreign (never judged). Every service port without
/// a serving endpoint is judged at once (an empty set); [`Settle`] holds them back for a while.
pub fn build_facts<'a>(
    services: impl IntoIterator<Item = (&'a str, &'a str, &'a ServiceFacts)>,
    slices: impl IntoIterator<Item = (&'a str, &'a SliceFacts)>,
) -> Model {
    let mut by_service: HashMap<(&str, &str), Vec<&SliceFacts>> = HashMap::new();
    for (ns, s) in slices {
        if let Some(svc) = &s.service {
            by_service.entry((ns, svc)).or_default().push(s);
        }
    }
    let services: Vec<_> = services.into_iter().collect();
    PerFamily(Family::ALL.map(|fam| {
        let mut m = FamilyModel::default();
        for (ns, name, svc) in &services {
            let slices = by_service.get(&(*ns, *name)).map_or(&[][..], Vec::as_slice);
            add_service(&mut m, &service_key(ns, name), svc, slices, fam);
        }
        m
    }))
}

/// [`build_facts`] from whole objects (tests, benches): each is decoded as the watch decodes it
/// ([`slim`]) and projected first.
pub fn build<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Model {
    let ns_name = |m: &'a ObjectMeta| {
        (
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or(""),
        )
    };
    let services: Vec<_> = services
        .into_iter()
        .map(|s| {
            (
                ns_name(&s.metadata),
                project::service(&slim::<WireService>(s)),
            )
        })
        .collect();
    let slices: Vec<_> = slices
        .into_iter()
        .map(|s| {
            (
                ns_name(&s.metadata).0,
                project::slice(&slim::<WireSlice>(s)),
            )
        })
        .collect();
    build_facts(
        services.iter().map(|((ns, name), v)| (*ns, *name, v)),
        slices.iter().map(|(ns, v)| (*ns, v)),
    )
}

impl Model {
    /// [`Model::with_service_ranges`] from whole objects (tests).
    pub fn with_service_ips<'a>(
        self,
        cidrs: impl IntoIterator<Item = &'a ServiceCIDR>,
        addresses: impl IntoIterator<Item = &'a IPAddress>,
    ) -> Self {
        let ranges: Vec<ServiceIpRange> = cidrs
            .into_iter()
            .flat_map(|c| project::service_cidr(c).into_vec())
            .collect();
        let allocated = addresses
            .into_iter()
            .filter_map(|a| project::ip_address(&slim::<WireIpAddress>(a)));
        self.with_service_ranges(&ranges, allocated)
    }

    /// [`Model::with_node_ips`] from the whole Node (tests).
    pub fn with_node(self, node: Option<&Node>) -> Self {
        let ips = node.map(project::node).unwrap_or_default();
        self.with_node_ips(&ips)
    }
}

/// A frontend or nodePort of one family that a live service held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Frontend(SocketAddr),
    NodePort(Family, u16),
}

/// The keys kube-proxy's services hold (`ours`) and those another proxy's services hold.
fn live_keys(m: &Model) -> (HashSet<Key>, HashSet<Key>) {
    let (mut ours, mut foreign) = (HashSet::new(), HashSet::new());
    for (fam, fm) in m.iter() {
        ours.extend(
            fm.frontends
                .keys()
                .chain(&fm.settling_frontends)
                .map(|f| Key::Frontend(*f)),
        );
        ours.extend(
            fm.node_ports
                .keys()
                .chain(&fm.settling_node_ports)
                .map(|p| Key::NodePort(fam, *p)),
        );
        foreign.extend(fm.foreign_frontends.iter().map(|f| Key::Frontend(*f)));
        foreign.extend(fm.foreign_node_ports.iter().map(|p| Key::NodePort(fam, *p)));
    }
    (ours, foreign)
}

/// Remembers frontends and nodePorts that live services stopped holding (service deleted, UDP
/// port removed or changed, ExternalIP or LB VIP removed, nodePort changed), for `retention`
/// after they went, so the flows still DNATed through them are deleted (kubernetes#141371
/// registers the service ports deleted in a sync the same way). Only what this process saw
/// go is remembered: after a restart, the orphan rule covers ClusterIPs.
#[derive(Debug)]
pub struct Tombstones {
    retention: Duration,
    prev: Option<HashSet<Key>>,
    gone: HashMap<Key, Instant>,
}

impl Tombstones {
    pub fn new(retention: Duration) -> Self {
        Self {
            retention,
            prev: None,
            gone: HashMap::new(),
        }
    }

    /// Takes the model built from the live lists at `now`, records what went since the last
    /// call, and adds every unexpired tombstone that no live service holds again.
    pub fn apply(&mut self, mut m: Model, now: Instant) -> Model {
        // Only what kube-proxy's services held is remembered: another proxy's flows are not
        // ours to judge, and a service handed to another proxy is not a deletion.
        let (ours, foreign) = live_keys(&m);
        let live: HashSet<Key> = ours.union(&foreign).copied().collect();
        if let Some(prev) = &self.prev {
            for k in prev.difference(&live) {
                self.gone.insert(*k, now + self.retention);
            }
        }
        self.gone
            .retain(|k, until| *until > now && !live.contains(k));
        for k in self.gone.keys() {
            match *k {
                Key::Frontend(f) => {
                    m[Family::of(f.ip())].deleted_frontends.insert(f);
                }
                Key::NodePort(fam, p) => {
                    m[fam].deleted_node_ports.insert(p);
                }
            }
        }
        self.prev = Some(ours);
        m
    }
}

/// Holds back the zero-endpoint rule (kubernetes#139629) for a live service port until "no
/// serving endpoint" has held for `after`: an EndpointSlice deleted and re-created (by hand, by
/// a controller resync) leaves a live service without endpoints for a moment, and judging its
/// flows then would cut every healthy one. Until then the port's frontends and nodePort are
/// `settling` (not judged, as kube-proxy v1.36 skips such a service). A deleted service is not
/// held back: its frontends become deleted ones at once (`Tombstones`).
#[derive(Debug)]
pub struct Settle {
    after: Duration,
    /// (service, port name, family) -> first build that saw it without a serving endpoint.
    since: HashMap<(String, String, Family), Instant>,
}

impl Settle {
    pub fn new(after: Duration) -> Self {
        Self {
            after,
            since: HashMap::new(),
        }
    }

    /// Takes the model built from the live lists at `now`: a port without a serving endpoint
    /// for less than `after` becomes settling; a port served again is forgotten.
    pub fn apply(&mut self, mut m: Model, now: Instant) -> Model {
        let mut seen = HashSet::new();
        for fam in Family::ALL {
            let fm = &mut m[fam];
            let mut held: Vec<Claim> = Vec::new();
            for (svc, ports) in &mut fm.services {
                for (port, claim) in ports.iter_mut() {
                    if !claim.serving.is_empty() {
                        continue;
                    }
                    let key = (svc.clone(), port.to_string(), fam);
                    let since = *self.since.entry(key.clone()).or_insert(now);
                    seen.insert(key);
                    if now.saturating_duration_since(since) < self.after {
                        claim.settling = true;
                        held.push(claim.clone());
                    }
                }
            }
            for claim in held {
                for &f in &claim.frontends {
                    fm.frontends.remove(&f);
                    fm.settling_frontends.insert(f);
                }
                if let Some(np) = claim.node_port {
                    fm.node_ports.remove(&np);
                    fm.settling_node_ports.insert(np);
                }
            }
        }
        self.since.retain(|k, _| seen.contains(k));
        m
    }

    /// How long after `now` the next settling port settles: the model changes then by time
    /// alone, and must be rebuilt for the zero-endpoint rule to apply.
    pub fn next_change(&self, now: Instant) -> Option<Duration> {
        self.since
            .values()
            .map(|since| (*since + self.after).saturating_duration_since(now))
            .filter(|d| !d.is_zero())
            .min()
    }
}

pub mod whole;
