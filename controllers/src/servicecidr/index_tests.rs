//! The IP index's tests: examples, the property that the compact index answers exactly as a
//! plain reference index over generated update sequences, and the property that ServiceCIDRs
//! deleted together never orphan an IP.

/// The reference model of the index: entries by name in a `Store` beside address-sorted name
/// lists, the plain way to answer the index's questions, with none of the compact index's
/// sharing. The compact index must answer exactly as it does.
mod reference {
    use std::{collections::BTreeMap, sync::Arc};

    use groundskeeper_plumbing::watch::cache::{Applied, Store, Update};

    use super::super::index::{Blocker, Blockers, CidrSet, IpAddressFacts, uncovered};
    use super::super::prefix::{Addr, Family, Prefix};

    /// Allocator-managed IPAddresses (`ipaddress.kubernetes.io/managed-by=ipallocator.k8s.io`)
    /// whose names parse as IPs: the entries by name in a [`Store`] (a relist is swapped in
    /// whole), and beside it only their names sorted by address within each family, so an entry
    /// is kept once however many IPs there are.
    #[derive(Default)]
    pub struct ReferenceIpIndex {
        entries: Store<Arc<str>, IpAddressFacts>,
        v4: BTreeMap<u128, Vec<Arc<str>>>,
        v6: BTreeMap<u128, Vec<Arc<str>>>,
    }

    impl std::fmt::Debug for ReferenceIpIndex {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("ReferenceIpIndex")
                .field("v4", &self.v4)
                .field("v6", &self.v6)
                .finish()
        }
    }

    /// The address a kept name stands for: only names that parse are ever kept.
    fn addr_of(name: &str) -> Addr {
        Addr::parse(name).expect("only names that are IPs are indexed")
    }

    impl ReferenceIpIndex {
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

        /// Applies one watch update (names that are not IPs are not indexed) and returns the
        /// addresses that appeared or disappeared: an update of a kept name changes no address.
        pub fn apply(&mut self, u: Update<Arc<str>, IpAddressFacts>) -> Vec<Addr> {
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
}

mod examples {
    use super::super::index::fixtures::{ips as index, managed, set};
    use super::super::index::*;
    use super::super::prefix::{Addr, Family, Prefix};

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
        ix.upsert(IpAddressFacts {
            family_label: None,
            ..managed("10.0.1.5")
        });
        ix.upsert(IpAddressFacts {
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

/// The compact index against the one it replaced, over generated update sequences: the same
/// addresses reported changed, the same size, and the same orphans at every limit (so the same
/// decision) for every ServiceCIDR, after every update.
mod same_as_reference {
    use std::{net::Ipv6Addr, sync::Arc};

    use groundskeeper_plumbing::watch::cache::Update;
    use testkit::rng::Rng;

    use super::super::decide::BLOCKERS_REPORTED;
    use super::super::index::{Blockers, CidrSet, IpAddressFacts, IpIndex, Owner};
    use super::super::prefix::{Addr, Family};
    use super::reference::ReferenceIpIndex;

    const CIDRS: &[&str] = &[
        "10.0.0.0/25",
        "10.0.0.0/26",
        "10.0.0.64/26",
        "10.0.0.32/27",
        "10.0.0.0/24",
        "10.0.0.5/32",
        "10.0.0.0/31",
        "10.0.0.8/30",
        "fd00::/120",
        "fd00::/122",
        "fd00::20/123",
        "::ffff:10.0.0.0/120",
        "::ffff:10.0.0.0/122",
        "not-a-cidr",
    ];

    /// A name for an address of the pool: canonical, or (when `spellings`) the same address
    /// written another way; now and then not an IP at all.
    fn name(r: &mut Rng, spellings: bool) -> String {
        if r.chance(3) {
            return "not-an-ip".into();
        }
        let host = r.below(72) as u32;
        match r.below(3) {
            0 => std::net::Ipv4Addr::from(0x0a00_0000 + host).to_string(),
            1 => {
                let v6 = Ipv6Addr::from(0xfd00u128 << 112 | u128::from(host));
                if spellings && r.chance(40) {
                    match r.below(3) {
                        0 => v6.to_string().to_uppercase(),
                        1 => format!("fd00:0:0:0:0:0:0:{host:x}"),
                        _ => format!("fd00::0:{host:x}"),
                    }
                } else {
                    v6.to_string()
                }
            }
            _ => {
                if spellings && r.chance(40) {
                    format!("::ffff:a00:{host:x}")
                } else {
                    format!("::ffff:10.0.0.{host}")
                }
            }
        }
    }

    fn entry(r: &mut Rng, name: &str) -> IpAddressFacts {
        let own = Addr::parse(name).map(|a| a.family);
        let family_label = match r.below(10) {
            0 => None,
            1 => Some(Family::V4),
            2 => Some(Family::V6),
            _ => own,
        };
        let owner = r.chance(85).then(|| Owner {
            resource: r.pick(&["services", "gateways"]).into(),
            namespace: r
                .pick(&[None, Some("a"), Some("b"), Some("")])
                .map(String::from),
            name: format!("svc-{}", r.below(20)),
        });
        IpAddressFacts {
            name: name.into(),
            family_label,
            owner,
        }
    }

    fn cidr_set(r: &mut Rng) -> (CidrSet, Vec<String>) {
        let mut s = CidrSet::default();
        let names: Vec<String> = (0..1 + r.below(5)).map(|i| format!("c{i}")).collect();
        for n in &names {
            let cidrs: Vec<String> = (0..1 + r.below(2))
                .map(|_| r.pick(CIDRS).to_string())
                .collect();
            s.insert(n, &cidrs);
        }
        (s, names)
    }

    fn updates(r: &mut Rng, spellings: bool) -> Vec<Update<Arc<str>, IpAddressFacts>> {
        let mut out = Vec::new();
        match r.below(100) {
            0..55 => {
                let n = name(r, spellings);
                let e = entry(r, &n);
                out.push(Update::Apply(n.into(), e));
            }
            55..80 => out.push(Update::Delete(name(r, spellings).into())),
            80..97 => {
                out.push(Update::Init);
                for _ in 0..r.below(30) {
                    let n = name(r, spellings);
                    let e = entry(r, &n);
                    out.push(Update::InitApply(n.into(), e));
                }
                out.push(Update::InitDone);
            }
            // A list item with no list begun: the store starts one.
            _ => {
                let n = name(r, spellings);
                let e = entry(r, &n);
                out.push(Update::InitApply(n.into(), e));
            }
        }
        out
    }

    fn copy(u: &Update<Arc<str>, IpAddressFacts>) -> Update<Arc<str>, IpAddressFacts> {
        match u {
            Update::Init => Update::Init,
            Update::InitDone => Update::InitDone,
            Update::InitApply(k, v) => Update::InitApply(k.clone(), v.clone()),
            Update::Apply(k, v) => Update::Apply(k.clone(), v.clone()),
            Update::Delete(k) => Update::Delete(k.clone()),
        }
    }

    fn sorted(b: &Blockers) -> Vec<(Addr, String)> {
        let mut v: Vec<(Addr, String)> = b
            .found
            .iter()
            .map(|x| (x.addr, format!("{:?}", x.entry)))
            .collect();
        v.sort();
        v
    }

    fn check(
        seed: u64,
        step: usize,
        spellings: bool,
        compact: &IpIndex,
        reference: &ReferenceIpIndex,
        s: &CidrSet,
        names: &[String],
    ) {
        let at = format!("seed {seed} step {step}");
        assert_eq!(compact.len(), reference.len(), "{at}: len");
        for n in names {
            // `decide` reads the index only through `orphans(…, BLOCKERS_REPORTED)`: the same
            // answer at that limit is the same decision.
            for limit in [0, 1, 3, BLOCKERS_REPORTED, usize::MAX] {
                let (a, b) = (compact.orphans(s, n, limit), reference.orphans(s, n, limit));
                let addrs = |x: &Blockers| x.found.iter().map(|f| f.addr).collect::<Vec<_>>();
                assert_eq!(a.more, b.more, "{at}: {n} limit {limit}: more");
                assert_eq!(addrs(&a), addrs(&b), "{at}: {n} limit {limit}: addresses");
                if !spellings {
                    assert_eq!(a, b, "{at}: {n} limit {limit}");
                } else if !a.more {
                    // Names of one address written differently: the reference orders them
                    // by its hash map after a relist, so only the set is comparable.
                    assert_eq!(sorted(&a), sorted(&b), "{at}: {n} limit {limit}");
                }
            }
        }
    }

    #[test]
    fn compact_index_answers_as_the_reference() {
        for seed in 0..400u64 {
            let mut r = Rng(seed);
            let spellings = seed % 2 == 1;
            let (s, names) = cidr_set(&mut r);
            let (mut compact, mut reference) = (IpIndex::default(), ReferenceIpIndex::default());
            for step in 0..60 {
                for u in updates(&mut r, spellings) {
                    let mut a = compact.apply(copy(&u));
                    let mut b = reference.apply(u);
                    a.sort();
                    b.sort();
                    assert_eq!(a, b, "seed {seed} step {step}: changed addresses");
                }
                check(seed, step, spellings, &compact, &reference, &s, &names);
            }
        }
    }
}

/// ServiceCIDRs deleted together: a deleting ServiceCIDR is nobody's parent and owns no IP for
/// another, so the finalizers released on one view of the cluster, all at once, never leave an
/// IP outside every remaining ServiceCIDR.
mod deleting_together {
    use jiff::Timestamp;
    use testkit::rng::Rng;

    use super::super::decide::{Action, CidrState, decide};
    use super::super::index::fixtures::{ips, set};
    use super::super::index::{CidrSet, IpIndex};
    use super::super::prefix::Addr;

    /// Overlapping CIDRs of both families, from one pool so that equal and nested ones are common.
    const V4: &[&str] = &[
        "10.0.0.0/24",
        "10.0.0.0/25",
        "10.0.0.128/25",
        "10.0.0.0/26",
        "10.0.0.64/26",
        "10.0.0.32/27",
        "10.0.0.0/23",
    ];
    const V6: &[&str] = &["fd00::/120", "fd00::/121", "fd00::80/121", "fd00::/119"];

    fn deleting(name: &str) -> CidrState {
        CidrState {
            name: name.into(),
            has_finalizer: true,
            deletion_timestamp: Some("2026-01-01T00:00:00Z".parse().unwrap()),
            ready: None,
        }
    }

    /// Well past the grace period: only the IPs decide.
    fn later() -> Timestamp {
        "2026-01-01T01:00:00Z".parse().unwrap()
    }

    /// The deleting ServiceCIDRs whose finalizer one view (`s`, `ix`) releases.
    fn released(s: &CidrSet, ix: &IpIndex, names: &[String]) -> Vec<String> {
        names
            .iter()
            .filter(|n| s.is_deleting(n))
            .filter(|n| decide(&deleting(n), s, ix, later()).contains(&Action::RemoveFinalizer))
            .cloned()
            .collect()
    }

    #[test]
    fn two_equal_cidrs_deleted_together_both_wait() {
        let ix = ips(&["10.0.0.5"]);
        let mut s = set(&[("a", &["10.0.0.0/24"])]);
        s.insert_with("b", &["10.0.0.0/24".to_string()], true);
        let names = ["a".to_string(), "b".to_string()];
        assert_eq!(
            released(&s, &ix, &names),
            vec!["b"],
            "a live equal ServiceCIDR is a parent"
        );
        s.insert_with("a", &["10.0.0.0/24".to_string()], true);
        assert_eq!(
            released(&s, &ix, &names),
            Vec::<String>::new(),
            "both deleting: neither holds the IP for the other"
        );
        // A smaller live one that contains the IP frees both.
        s.insert("c", &["10.0.0.0/28".to_string()]);
        let names = ["a".to_string(), "b".to_string(), "c".to_string()];
        assert_eq!(released(&s, &ix, &names), vec!["a", "b"]);
        // Without IPs there is nothing to orphan.
        assert_eq!(released(&s, &IpIndex::default(), &names), vec!["a", "b"]);
    }

    #[test]
    fn no_ip_is_left_outside_every_servicecidr() {
        let mut outcomes = [0usize; 2];
        for seed in 0..2000u64 {
            let mut r = Rng(seed);
            let mut s = CidrSet::default();
            let mut names = Vec::new();
            for i in 0..2 + r.below(4) {
                let mut cidrs = Vec::new();
                if r.chance(85) {
                    cidrs.push(r.pick(V4).to_string());
                }
                if r.chance(40) {
                    cidrs.push(r.pick(V6).to_string());
                }
                let name = format!("c{i}");
                s.insert_with(&name, &cidrs, r.chance(60));
                names.push(name);
            }
            let mut addrs = Vec::new();
            for _ in 0..r.below(6) {
                let host = r.below(512);
                addrs.push(if r.chance(70) {
                    std::net::Ipv4Addr::from(0x0a00_0000 + host as u32).to_string()
                } else {
                    format!("fd00::{host:x}")
                });
            }
            let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
            let ix = ips(&refs);
            let held = |s: &CidrSet| -> Vec<&str> {
                refs.iter()
                    .copied()
                    .filter(|a| !s.containing(Addr::parse(a).unwrap()).is_empty())
                    .collect()
            };
            // Every sync of one view releases at once, as workers on one cache do; then the
            // survivors are synced again on the view that follows, until nothing changes.
            for step in 0.. {
                let gone = released(&s, &ix, &names);
                if gone.is_empty() {
                    break;
                }
                let before = held(&s);
                for n in &gone {
                    s.remove(n);
                }
                names.retain(|n| !gone.contains(n));
                let after = held(&s);
                assert_eq!(
                    before, after,
                    "seed {seed} step {step}: releasing {gone:?} orphaned IPs; left {s:?}"
                );
                outcomes[0] += gone.len();
            }
            // And no deletion waits for nothing: each one still held has an IP that no
            // ServiceCIDR outside the deleting ones contains.
            for n in names.iter().filter(|n| s.is_deleting(n)) {
                let mut live = s.clone();
                for d in names.iter().filter(|d| s.is_deleting(d)) {
                    live.remove(d);
                }
                let own_only = refs.iter().any(|a| {
                    let a = Addr::parse(a).unwrap();
                    let mut only_me = s.clone();
                    for o in names.iter().filter(|o| *o != n) {
                        only_me.remove(o);
                    }
                    !only_me.containing(a).is_empty() && live.containing(a).is_empty()
                });
                assert!(
                    own_only,
                    "seed {seed}: {n} waits with nothing to hold in {s:?}"
                );
                outcomes[1] += 1;
            }
        }
        assert!(outcomes[0] > 500 && outcomes[1] > 500, "{outcomes:?}");
    }
}
