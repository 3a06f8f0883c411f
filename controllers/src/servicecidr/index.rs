//! The indexes the decision reads: ServiceCIDR prefixes, and managed IPs sorted by address.
//!
//! Every ServiceCIDR's parsed prefixes, and the allocator-managed IPAddresses sorted by address
//! per family, so that "which IPs would only this ServiceCIDR contain" is a few range queries
//! instead of a list-and-scan.

use std::{collections::BTreeMap, sync::Arc};

use groundskeeper_plumbing::cache::{Applied, Store, Update};

use super::prefix::{Addr, Family, Prefix};

/// Every ServiceCIDR by name with the CIDRs of its spec that parse (the upstream helpers skip
/// the others).
#[derive(Clone, Debug, Default)]
pub struct CidrSet {
    by_name: BTreeMap<String, Vec<Prefix>>,
}

impl CidrSet {
    pub fn insert(&mut self, name: &str, cidrs: &[String]) {
        let parsed = cidrs.iter().filter_map(|c| c.parse().ok()).collect();
        self.by_name.insert(name.to_string(), parsed);
    }

    pub fn remove(&mut self, name: &str) {
        self.by_name.remove(name);
    }

    pub fn get(&self, name: &str) -> Option<&[Prefix]> {
        self.by_name.get(name).map(Vec::as_slice)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    fn pairs(&self) -> impl Iterator<Item = (&str, usize, &Prefix)> {
        self.by_name
            .iter()
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
    /// or larger, as upstream counts them.
    pub fn parents_of(&self, prefix: &Prefix) -> Vec<&str> {
        self.pairs()
            .filter(|(_, _, p)| p.covers(prefix))
            .map(|(n, _, _)| n)
            .collect()
    }

    /// `canDeleteCIDR`'s first step: true when every parseable CIDR of `name` has a parent other
    /// than itself (vacuously true with no parseable CIDR).
    pub fn has_parent(&self, name: &str) -> bool {
        self.get(name).unwrap_or_default().iter().all(|p| {
            let parents = self.parents_of(p);
            !(parents.is_empty() || (parents.len() == 1 && parents[0] == name))
        })
    }
}

/// The Service (or other object) an IPAddress is allocated to, from `spec.parentRef`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub resource: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) if !ns.is_empty() => write!(f, "{} {}/{}", self.resource, ns, self.name),
            _ => write!(f, "{} {}", self.resource, self.name),
        }
    }
}

/// What is kept of one allocator-managed IPAddress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpEntry {
    /// The object's name as written (it is the IP); the same allocation as the index's key.
    pub name: Arc<str>,
    /// `ipaddress.kubernetes.io/ip-family`; canDelete only sees IPs whose label names the
    /// family of one of the ServiceCIDR's CIDRs, as upstream's label selector does.
    pub family_label: Option<Family>,
    pub owner: Option<Owner>,
}

/// An IPAddress that keeps a ServiceCIDR from being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocker {
    pub addr: Addr,
    pub entry: IpEntry,
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
/// whose names parse as IPs: the entries by name in a [`Store`] (a relist is swapped in
/// whole), and beside it only their names sorted by address within each family, so an entry
/// is kept once however many IPs there are.
#[derive(Default)]
pub struct IpIndex {
    entries: Store<Arc<str>, IpEntry>,
    v4: BTreeMap<u128, Vec<Arc<str>>>,
    v6: BTreeMap<u128, Vec<Arc<str>>>,
}

impl std::fmt::Debug for IpIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpIndex")
            .field("v4", &self.v4)
            .field("v6", &self.v6)
            .finish()
    }
}

/// The address a kept name stands for: only names that parse are ever kept.
fn addr_of(name: &str) -> Addr {
    Addr::parse(name).expect("only names that are IPs are indexed")
}

impl IpIndex {
    fn tree(&mut self, f: Family) -> &mut BTreeMap<u128, Vec<Arc<str>>> {
        match f {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }

    fn tree_ref(&self, f: Family) -> &BTreeMap<u128, Vec<Arc<str>>> {
        match f {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Applies one watch update (names that are not IPs are not indexed) and returns the
    /// addresses that appeared or disappeared: an update of a kept name changes no address.
    pub fn apply(&mut self, u: Update<Arc<str>, IpEntry>) -> Vec<Addr> {
        let u = match u {
            Update::Apply(k, _) | Update::InitApply(k, _) if Addr::parse(&k).is_none() => {
                return vec![];
            }
            u => u,
        };
        match self.entries.apply(u) {
            Applied::Nothing | Applied::Upserted { old: Some(_), .. } => vec![],
            Applied::Upserted { key, old: None } => vec![self.link(key)],
            Applied::Removed { key, .. } => vec![self.unlink(&key)],
            Applied::Relisted { old } => {
                let gone: Vec<Arc<str>> = old
                    .keys()
                    .filter(|k| !self.entries.contains(k))
                    .cloned()
                    .collect();
                let new: Vec<Arc<str>> = self
                    .entries
                    .keys()
                    .filter(|k| !old.contains_key(*k))
                    .cloned()
                    .collect();
                let mut changed: Vec<Addr> = gone.iter().map(|k| self.unlink(k)).collect();
                changed.extend(new.into_iter().map(|k| self.link(k)));
                changed
            }
        }
    }

    fn link(&mut self, name: Arc<str>) -> Addr {
        let a = addr_of(&name);
        self.tree(a.family).entry(a.value).or_default().push(name);
        a
    }

    fn unlink(&mut self, name: &str) -> Addr {
        let a = addr_of(name);
        let tree = self.tree(a.family);
        if let Some(names) = tree.get_mut(&a.value) {
            names.retain(|n| &**n != name);
            if names.is_empty() {
                tree.remove(&a.value);
            }
        }
        a
    }

    /// Adds or replaces the entry for `entry.name`; names that are not IPs are not indexed.
    /// Returns the address when the name is newly indexed.
    pub fn upsert(&mut self, entry: IpEntry) -> Option<Addr> {
        self.apply(Update::Apply(entry.name.clone(), entry)).pop()
    }

    /// Removes the entry by object name, returning its address if it was indexed.
    pub fn remove(&mut self, name: &str) -> Option<Addr> {
        self.apply(Update::Delete(name.into())).pop()
    }

    /// `canDeleteCIDR`'s orphan step: managed IPs that `PrefixContainsIP` places in exactly one
    /// (ServiceCIDR, CIDR) pair, that pair being one of `name`'s. Per CIDR of `name`, the
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
                for (value, names) in self.tree_ref(p.family()).range(a..=b) {
                    for e in names.iter().filter_map(|n| self.entries.get(n)) {
                        if !e.family_label.is_some_and(|f| families.contains(&f)) {
                            continue;
                        }
                        if out.found.len() == limit {
                            out.more = true;
                            return out;
                        }
                        out.found.push(Blocker {
                            addr: Addr {
                                family: p.family(),
                                value: *value,
                            },
                            entry: e.clone(),
                        });
                    }
                }
            }
        }
        out
    }
}

/// The parts of `[lo, hi]` not inside any of `covered` (inclusive ranges), in order.
fn uncovered(lo: u128, hi: u128, covered: &mut [(u128, u128)]) -> Vec<(u128, u128)> {
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
    pub fn managed(name: &str) -> IpEntry {
        IpEntry {
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

#[cfg(test)]
mod tests {
    use super::fixtures::{ips as index, managed, set};
    use super::*;

    fn orphan_names(ix: &IpIndex, s: &CidrSet, name: &str) -> Vec<String> {
        ix.orphans(s, name, usize::MAX)
            .found
            .into_iter()
            .map(|b| b.entry.name.to_string())
            .collect()
    }

    #[test]
    fn uncovered_ranges() {
        let mut c = vec![(5, 7), (2, 3), (6, 9)];
        assert_eq!(uncovered(1, 10, &mut c), vec![(1, 1), (4, 4), (10, 10)]);
        assert_eq!(uncovered(1, 10, &mut []), vec![(1, 10)]);
        assert_eq!(uncovered(1, 10, &mut [(0, 20)]), vec![]);
        assert_eq!(uncovered(1, 10, &mut [(0, 4), (8, 20)]), vec![(5, 7)]);
        assert_eq!(uncovered(0, u128::MAX, &mut [(1, u128::MAX)]), vec![(0, 0)]);
        assert_eq!(uncovered(5, 10, &mut [(11, 20)]), vec![(5, 10)]);
    }

    #[test]
    fn overlapping_and_containing_dedupe_names() {
        let s = layout("a=10.0.0.0/16,fd00::/64 b=10.0.1.0/24 c=10.1.0.0/16,garbage d=fd00::/112");
        let p: Prefix = "10.0.1.128/25".parse().unwrap();
        assert_eq!(s.overlapping(&[p]), vec!["a", "b"]);
        let v6: Prefix = "fd00::/120".parse().unwrap();
        assert_eq!(s.overlapping(&[p, v6]), vec!["a", "b", "d"]);
        assert_eq!(
            s.containing(Addr::parse("10.0.1.5").unwrap()),
            vec!["a", "b"]
        );
        assert_eq!(s.containing(Addr::parse("10.0.1.0").unwrap()), vec!["a"]);
        assert_eq!(s.containing(Addr::parse("10.0.1.255").unwrap()), vec!["a"]);
        // IPv6 for upstream (netip.ParseAddr): no IPv4 prefix contains it.
        assert_eq!(
            s.containing(Addr::parse("::ffff:10.1.0.9").unwrap()),
            Vec::<String>::new()
        );
        assert_eq!(
            s.containing(Addr::parse("fd00::").unwrap()),
            Vec::<String>::new()
        );
        assert_eq!(
            s.containing(Addr::parse("fd00::ff").unwrap()),
            vec!["a", "d"]
        );
    }

    /// ServiceCIDRs written `name=cidr,cidr name=…`.
    fn layout(spec: &str) -> CidrSet {
        let mut s = CidrSet::default();
        for item in spec.split_whitespace() {
            let (name, cidrs) = item.split_once('=').expect("name=cidrs");
            let cidrs: Vec<String> = cidrs
                .split(',')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect();
            s.insert(name, &cidrs);
        }
        s
    }

    #[test]
    fn parents_need_every_family_covered_by_another() {
        for (row, spec, want) in [
            ("alone", "x=10.0.1.0/24", false),
            ("a larger parent", "x=10.0.1.0/24 p=10.0.0.0/16", true),
            ("an equal parent", "x=10.0.1.0/24 p=10.0.1.0/24", true),
            (
                "only a smaller one inside",
                "x=10.0.0.0/16 c=10.0.1.0/24",
                false,
            ),
            (
                "only an overlapping half",
                "x=10.0.1.0/24 o=10.0.1.128/25",
                false,
            ),
            (
                "a parent for IPv4 only",
                "x=10.0.1.0/24,fd00::/112 p=10.0.0.0/16",
                false,
            ),
            (
                "a parent in each family",
                "x=10.0.1.0/24,fd00::/112 p=10.0.0.0/16 q=fd00::/64",
                true,
            ),
            ("no parseable CIDR", "x=bad,worse", true),
            ("no CIDR", "x=", true),
            (
                "a parseable CIDR beside a bad one",
                "x=bad,10.0.1.0/24",
                false,
            ),
        ] {
            assert_eq!(layout(spec).has_parent("x"), want, "{row}: {spec}");
        }
    }

    #[test]
    fn orphans_exclude_network_broadcast_and_covered_ips() {
        let ix = index(&[
            "10.0.1.0",
            "10.0.1.255",
            "10.0.1.7",
            "10.0.1.200",
            "10.0.2.5",
            "fd00::",
            "fd00::ffff",
            "fd00::1:0",
        ]);
        let s = set(&[("x", &["10.0.1.0/24", "fd00::/112"])]);
        assert_eq!(
            orphan_names(&ix, &s, "x"),
            vec!["10.0.1.7", "10.0.1.200", "fd00::ffff"]
        );
        // An overlapping smaller CIDR takes the IPs it contains off the list.
        let s = set(&[
            ("x", &["10.0.1.0/24", "fd00::/112"]),
            ("y", &["10.0.1.128/25"]),
        ]);
        assert_eq!(orphan_names(&ix, &s, "x"), vec!["10.0.1.7", "fd00::ffff"]);
        // ...but not its own network address: 10.0.1.128 is not contained by y.
        let ix2 = index(&["10.0.1.128", "10.0.1.255"]);
        assert_eq!(orphan_names(&ix2, &s, "x"), vec!["10.0.1.128"]);
        assert_eq!(orphan_names(&ix2, &s, "y"), Vec::<String>::new());
    }

    #[test]
    fn orphans_respect_family_label_and_management() {
        let mut ix = IpIndex::default();
        ix.upsert(IpEntry {
            family_label: None,
            ..managed("10.0.1.5")
        });
        ix.upsert(IpEntry {
            family_label: Some(Family::V6),
            ..managed("::ffff:10.0.1.6")
        });
        let s = set(&[("x", &["10.0.1.0/24"])]);
        assert!(!ix.orphans(&s, "x", 10).is_blocked());
        let s = set(&[("x", &["10.0.1.0/24", "::ffff:10.0.1.0/120"])]);
        // The IPv6-labelled mapped address is listed by the IPv6 selector and owned by the
        // mapped IPv6 CIDR, never by the IPv4 one.
        assert_eq!(orphan_names(&ix, &s, "x"), vec!["::ffff:10.0.1.6"]);
        let s = set(&[("x", &["10.0.1.0/24", "fd00::/112"])]);
        assert!(!ix.orphans(&s, "x", 10).is_blocked());
        assert!(ix.upsert(managed("not-an-ip")).is_none());
        assert_eq!(ix.len(), 2);
    }

    #[test]
    fn upsert_and_remove_keep_the_index_consistent() {
        let mut ix = IpIndex::default();
        assert!(ix.upsert(managed("10.0.1.5")).is_some());
        assert!(
            ix.upsert(managed("10.0.1.5")).is_none(),
            "replace is not an add"
        );
        assert!(
            ix.upsert(managed("::ffff:10.0.1.5")).is_some(),
            "another address (IPv6), another name"
        );
        let s = set(&[("x", &["10.0.1.0/24", "::ffff:10.0.1.0/120"])]);
        assert_eq!(ix.orphans(&s, "x", 10).found.len(), 2);
        assert!(ix.remove("10.0.1.5").is_some());
        assert!(ix.remove("10.0.1.5").is_none());
        assert_eq!(orphan_names(&ix, &s, "x"), vec!["::ffff:10.0.1.5"]);
        ix.remove("::ffff:10.0.1.5");
        assert!(ix.is_empty());
        assert!(!ix.orphans(&s, "x", 10).is_blocked());
    }

    #[test]
    fn limit_reports_more() {
        let ix = index(&["10.0.1.1", "10.0.1.2", "10.0.1.3"]);
        let s = set(&[("x", &["10.0.1.0/24"])]);
        let b = ix.orphans(&s, "x", 2);
        assert_eq!(b.found.len(), 2);
        assert!(b.more);
        let b = ix.orphans(&s, "x", 3);
        assert!(!b.more);
    }

    /// The range query must agree with upstream's literal list-and-scan on arbitrary layouts.
    #[test]
    fn agrees_with_literal_scan() {
        let s = layout(
            "x=10.0.0.0/22,fd00::/120 a=10.0.1.0/24 b=10.0.2.64/26,fd00::80/121 \
             c=10.0.3.255/32,10.0.2.0/31 d=10.0.0.0/23",
        );
        let mut names = Vec::new();
        for i in 0..1024u32 {
            names.push(std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string());
        }
        for i in 0..256u32 {
            names.push(format!("fd00::{i:x}"));
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let ix = index(&refs);
        for name in ["x", "a", "b", "c", "d"] {
            let literal: Vec<String> = names
                .iter()
                .filter(|ip| {
                    let addr = Addr::parse(ip).unwrap();
                    let owners: Vec<&str> = s
                        .pairs()
                        .filter(|(_, _, p)| p.contains_ip(addr))
                        .map(|(n, _, _)| n)
                        .collect();
                    owners.len() == 1 && owners[0] == name
                })
                .cloned()
                .collect();
            let mut got = orphan_names(&ix, &s, name);
            let mut want = literal;
            got.sort();
            want.sort();
            assert_eq!(got, want, "{name}");
        }
    }
}
