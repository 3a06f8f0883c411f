//! The pure decisions: is one conntrack entry stale for a service model, and when should the
//! next periodic pass run.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::msg::{Entry, IPPROTO_UDP};

/// One IP family's UDP services, as kube-proxy's CleanStaleEntries sees them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FamilyModel {
    /// `frontend IP:port -> serving endpoints IP:port` (ClusterIP, ExternalIPs, LB VIPs).
    pub frontends: HashMap<SocketAddr, HashSet<SocketAddr>>,
    /// `nodePort -> serving endpoints IP:port`, matched on destination port only.
    pub node_ports: HashMap<u16, HashSet<SocketAddr>>,
}

impl FamilyModel {
    /// Nothing to compare entries against: a pass could not delete anything.
    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty() && self.node_ports.is_empty()
    }
}

/// Both families; each pass uses one.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Model {
    pub ipv4: FamilyModel,
    pub ipv6: FamilyModel,
}

/// Go's `net.IP.String()` prints an IPv4-mapped IPv6 address as IPv4; comparing canonical
/// forms keeps the same equalities.
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Why an entry is stale, for the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// Original destination is a service frontend whose serving endpoints lack the reply source.
    Frontend,
    /// Destination port is a NodePort whose serving endpoints lack the reply source.
    NodePort,
}

/// kube-proxy v1.36 CleanStaleEntries step 3. Only UDP entries are ever stale. The reply
/// source is where the flow was DNATed to; it must be a serving endpoint of the frontend.
///
/// One deliberate difference: upstream also applies the NodePort rule to an entry whose
/// frontend matched and whose backend serves that frontend (so a ClusterIP flow on a port
/// number that equals another service's NodePort gets deleted). Here a matching frontend
/// decides alone; the NodePort rule applies only to entries that hit no frontend.
pub fn stale(entry: &Entry, model: &FamilyModel) -> Option<Stale> {
    if entry.orig.proto != IPPROTO_UDP {
        return None;
    }
    let backend = SocketAddr::new(canonical(entry.reply.src), entry.reply.src_port);
    let frontend = SocketAddr::new(canonical(entry.orig.dst), entry.orig.dst_port);
    if let Some(serving) = model.frontends.get(&frontend) {
        return (!serving.contains(&backend)).then_some(Stale::Frontend);
    }
    if let Some(serving) = model.node_ports.get(&entry.orig.dst_port) {
        return (!serving.contains(&backend)).then_some(Stale::NodePort);
    }
    None
}

pub fn is_stale(entry: &Entry, model: &FamilyModel) -> bool {
    stale(entry, model).is_some()
}

/// Cilium's CT GC interval rule: a pass that deleted more than 25% of what it scanned comes
/// back sooner (by that ratio, at most 90%), one that deleted under 5% comes back 1.5x later;
/// rounded to whole seconds and clamped to `[min, max]`. A pass that scanned nothing keeps
/// the interval (there is no ratio to judge by).
pub fn next_interval(
    prev: Duration,
    scanned: usize,
    deleted: usize,
    min: Duration,
    max: Duration,
) -> Duration {
    if scanned == 0 {
        return prev.clamp(min, max.max(min));
    }
    let ratio = deleted as f64 / scanned as f64;
    let next = if ratio > 0.25 {
        prev.mul_f64(1.0 - ratio.min(0.9))
    } else if ratio < 0.05 {
        prev.mul_f64(1.5)
    } else {
        prev
    };
    let rounded = Duration::from_secs(next.as_secs_f64().round() as u64);
    rounded.clamp(min, max.max(min))
}

#[cfg(test)]
#[path = "clean_tests.rs"]
mod tests;
