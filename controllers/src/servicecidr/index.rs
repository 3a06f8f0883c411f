//! The indexes the decision reads: ServiceCIDR prefixes, and managed IPs sorted by address.
//!
//! Every ServiceCIDR's parsed prefixes, and the allocator-managed IPAddresses sorted by address
//! per family, so that "which IPs would only this ServiceCIDR contain" is a few range queries
//! instead of a list-and-scan.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use groundskeeper_plumbing::watch::cache::Update;

pub use super::compact::{IpAddressFacts, Owner};
use super::{
    compact::{Entries, Scopes, written},
    prefix::{Addr, Family, Prefix},
};

/// Every ServiceCIDR by name with the CIDRs of its spec that parse (the upstream helpers skip
/// the others), and whether it is being deleted.
#[derive(Clone, Debug, Default)]
pub struct CidrSet {
    by_name: BTreeMap<String, Vec<Prefix>>,
    /// ServiceCIDRs with a `deletionTimestamp`: they still enqueue and are still synced, but
    /// they hold no IP for another one, since their own finalizer may go at the same moment.
    deleting: BTreeSet<String>,
}

impl CidrSet {
    /// Adds or replaces a ServiceCIDR that is not being deleted.
    pub fn insert(&mut self, name: &str, cidrs: &[String]) {
        self.insert_with(name, cidrs, false);
    }

    /// Adds or replaces a ServiceCIDR, `deleting` when it has a `deletionTimestamp`.
    pub fn insert_with(&mut self, name: &str, cidrs: &[String], deleting: bool) {
        let parsed = cidrs.iter().filter_map(|c| c.parse().ok()).collect();
        self.by_name.insert(name.to_string(), parsed);
        if deleting {
            self.deleting.insert(name.to_string());
        } else {
            self.deleting.remove(name);
        }
    }

    pub fn remove(&mut self, name: &str) {
        self.by_name.remove(name);
        self.deleting.remove(name);
    }

    pub fn get(&self, name: &str) -> Option<&[Prefix]> {
        self.by_name.get(name).map(Vec::as_slice)
    }

    pub fn is_deleting(&self, name: &str) -> bool {
        self.deleting.contains(name)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The (ServiceCIDR, CIDR index, CIDR) pairs that can hold IPs for another ServiceCIDR: every
    /// CIDR of every ServiceCIDR not being deleted. Upstream counts deleting ones too, so two
    /// overlapping ServiceCIDRs deleted together each see the other as parent (or as a second
    /// owner of their IPs) and both lose their finalizer, orphaning the IPs they shared.
    pub(super) fn pairs(&self) -> impl Iterator<Item = (&str, usize, &Prefix)> {
        self.by_name
            .iter()
            .filter(|(n, _)| !self.deleting.contains(*n))
            .flat_map(|(n, ps)| ps.iter().enumerate().map(move |(i, p)| (n.as_str(), i, p)))
    }

    /// `overlappingServiceCIDRs`: names of ServiceCIDRs with any CIDR overlapping any of
    /// `prefixes`, once each.
    pub fn overlapping(&self, prefixes: &[Prefix]) -> Vec<String> {
        self.names_where(|p| prefixes.iter().any(|q| p.overlaps(q)))
    }

    /// `containingServiceCIDRs` after the label and name checks: names of ServiceCIDRs for
    /// which `PrefixContainsIP` holds for any CIDR, once each.
    pub fn containing(&self, addr: Addr) -> Vec<String> {
        self.names_where(|p| p.contains_ip(addr))
    }

    fn names_where(&self, f: impl Fn(&Prefix) -> bool) -> Vec<String> {
        self.by_name
            .iter()
            .filter(|(_, ps)| ps.iter().any(&f))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// `ContainsPrefix`: one entry per (ServiceCIDR, CIDR) that overlaps `prefix` and is equal
    /// or larger, as upstream counts them, among the ServiceCIDRs not being deleted.
    pub fn parents_of(&self, prefix: &Prefix) -> Vec<&str> {
        self.pairs()
            .filter(|(_, _, p)| p.covers(prefix))
            .map(|(n, _, _)| n)
            .collect()
    }

    /// `canDeleteCIDR`'s first step: true when every parseable CIDR of `name` has a parent other
    /// than itself that is not being deleted (vacuously true with no parseable CIDR).
    pub fn has_parent(&self, name: &str) -> bool {
        self.get(name).unwrap_or_default().iter().all(|p| {
            let parents = self.parents_of(p);
            !(parents.is_empty() || (parents.len() == 1 && parents[0] == name))
        })
    }
}

/// An IPAddress that keeps a ServiceCIDR from being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    pub addr: Addr,
    pub entry: IpAddressFacts,
}

/// Blockers found, at most the limit asked for, and whether there are more.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blockers {
    pub found: Vec<Blocker>,
    pub more: bool,
}

impl Blockers {
    pub fn is_blocked(&self) -> bool {
        !self.found.is_empty()
    }
}

/// Allocator-managed IPAddresses (`ipaddress.kubernetes.io/managed-by=ipallocator.k8s.io`)
/// whose names parse as IPs, sorted by address within each family (`compact` says how they
/// are kept small). A relist is buffered beside the live entries and swapped in whole, as
/// `plumbing::watch::cache::Store` does, so a reader never sees half a list.
#[derive(Default)]
pub struct IpIndex {
    live: Entries,
    relist: Option<Entries>,
    scopes: Scopes,
}

impl std::fmt::Debug for IpIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.live.iter().map(|(a, s)| (a, s.entry(a).name)))
            .finish()
    }
}

impl IpIndex {
    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.len() == 0
    }

    /// Applies one watch update (names that are not IPs are not indexed) and returns the
    /// addresses that appeared or disappeared: an update of a kept name changes no address.
    pub fn apply(&mut self, u: Update<Arc<str>, IpAddressFacts>) -> Vec<Addr> {
        match u {
            Update::Init => {
                self.relist = Some(Entries::default());
                vec![]
            }
            Update::InitApply(name, entry) => {
                if let Some(addr) = Addr::parse(&name) {
                    let slot = self.scopes.slot(entry, written(addr, &name));
                    self.relist
                        .get_or_insert_with(Entries::default)
                        .insert(addr, slot);
                }
                vec![]
            }
            Update::InitDone => {
                let new = self.relist.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.live, new);
                let gone = old
                    .iter()
                    .filter(|(a, s)| !self.live.contains(*a, s.written()))
                    .map(|(a, _)| a);
                let mut changed: Vec<Addr> = gone.collect();
                changed.extend(
                    self.live
                        .iter()
                        .filter(|(a, s)| !old.contains(*a, s.written()))
                        .map(|(a, _)| a),
                );
                changed
            }
            Update::Apply(name, entry) => {
                let Some(addr) = Addr::parse(&name) else {
                    return vec![];
                };
                let slot = self.scopes.slot(entry, written(addr, &name));
                if self.live.insert(addr, slot) {
                    vec![addr]
                } else {
                    vec![]
                }
            }
            Update::Delete(name) => {
                let Some(addr) = Addr::parse(&name) else {
                    return vec![];
                };
                if self.live.remove(addr, written(addr, &name).as_deref()) {
                    vec![addr]
                } else {
                    vec![]
                }
            }
        }
    }

    /// Adds or replaces the entry for `entry.name`; names that are not IPs are not indexed.
    /// Returns the address when the name is newly indexed.
    pub fn upsert(&mut self, entry: IpAddressFacts) -> Option<Addr> {
        self.apply(Update::Apply(entry.name.clone(), entry)).pop()
    }

    /// Removes the entry by object name, returning its address if it was indexed.
    pub fn remove(&mut self, name: &str) -> Option<Addr> {
        self.apply(Update::Delete(name.into())).pop()
    }

    /// `canDeleteCIDR`'s orphan step: managed IPs that `PrefixContainsIP` places in exactly one
    /// (ServiceCIDR, CIDR) pair, that pair being one of `name`'s; pairs of ServiceCIDRs being
    /// deleted do not count. Per CIDR of `name`, the
    /// ranges contained by every other pair are cut out of its usable range and only the rest
    /// is read from the index, so the cost follows the number of overlapping CIDRs and of
    /// blockers returned, not the number of IPs. At most `limit` blockers are returned.
    pub fn orphans(&self, cidrs: &CidrSet, name: &str, limit: usize) -> Blockers {
        let mut out = Blockers::default();
        let own = cidrs.get(name).unwrap_or_default();
        let families: Vec<Family> = own.iter().map(Prefix::family).collect();
        for (i, p) in own.iter().enumerate() {
            let Some((lo, hi)) = p.usable() else { continue };
            let mut covered: Vec<(u128, u128)> = cidrs
                .pairs()
                .filter(|&(n, j, q)| !(n == name && j == i) && q.family() == p.family())
                .filter_map(|(_, _, q)| q.usable())
                .filter(|&(a, b)| a <= hi && b >= lo)
                .collect();
            for (a, b) in uncovered(lo, hi, &mut covered) {
                for (value, slot) in self.live.family(p.family()).range(a, b) {
                    if !slot.family_label().is_some_and(|f| families.contains(&f)) {
                        continue;
                    }
                    if out.found.len() == limit {
                        out.more = true;
                        return out;
                    }
                    let addr = Addr {
                        family: p.family(),
                        value,
                    };
                    out.found.push(Blocker {
                        addr,
                        entry: slot.entry(addr),
                    });
                }
            }
        }
        out
    }
}

/// The parts of `[lo, hi]` not inside any of `covered` (inclusive ranges), in order.
pub(super) fn uncovered(lo: u128, hi: u128, covered: &mut [(u128, u128)]) -> Vec<(u128, u128)> {
    covered.sort_unstable();
    let mut out = Vec::new();
    let mut next = Some(lo);
    for &(a, b) in covered.iter() {
        let Some(start) = next else { break };
        if b < start {
            continue;
        }
        if a > start {
            out.push((start, (a - 1).min(hi)));
        }
        next = b.checked_add(1).filter(|n| *n <= hi);
        if a > hi {
            next = None;
        }
    }
    if let Some(start) = next {
        out.push((start, hi));
    }
    out.retain(|(a, b)| a <= b);
    out
}

/// Builders the decision tests of this module and its neighbours share.
#[cfg(test)]
pub(super) mod fixtures {
    use super::*;

    /// ServiceCIDRs by name with the CIDRs of their spec.
    pub fn set(items: &[(&str, &[&str])]) -> CidrSet {
        let mut s = CidrSet::default();
        for (n, cs) in items {
            let cs: Vec<String> = cs.iter().map(|c| c.to_string()).collect();
            s.insert(n, &cs);
        }
        s
    }

    /// A managed IP labelled with its own family, owned by Service `default/svc-<name>`.
    pub fn managed(name: &str) -> IpAddressFacts {
        IpAddressFacts {
            name: name.into(),
            family_label: Addr::parse(name).map(|a| a.family),
            owner: Some(Owner {
                resource: "services".into(),
                namespace: Some("default".into()),
                name: format!("svc-{name}"),
            }),
        }
    }

    pub fn ips(names: &[&str]) -> IpIndex {
        let mut ix = IpIndex::default();
        for n in names {
            ix.upsert(managed(n));
        }
        ix
    }
}
