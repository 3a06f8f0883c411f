//! What one service port claims, in compact forms: 10k services hold one claim each per
//! family, and B-tree sets and maps allocate a node of 11 slots however few they hold (about
//! 1.5 KB a service for one port of 10 endpoints; these take about 0.4 KB).

use std::net::SocketAddr;
use std::sync::Arc;

/// What one UDP service port claims in one family.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Claim {
    /// ClusterIP, ExternalIPs and LB VIPs, on the service port.
    pub frontends: Addrs,
    pub node_port: Option<u16>,
    pub serving: Addrs,
    /// No serving endpoint, for less than the settle time: its frontends are not judged yet.
    pub settling: bool,
}

/// A set of `IP:port`s, sorted, in one shared allocation: a claim's serving endpoints and the
/// model's entry for each frontend it alone claims are one list (`Live::refresh`), and a copy
/// of the model copies pointers. A `HashSet` per frontend would be megabytes more at 10k
/// services of 10 endpoints.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Addrs(Arc<[SocketAddr]>);

impl Addrs {
    pub fn contains(&self, a: &SocketAddr) -> bool {
        self.0.binary_search(a).is_ok()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, SocketAddr> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Those of `self` that `other` does not hold.
    pub fn difference<'a>(&'a self, other: &'a Addrs) -> impl Iterator<Item = &'a SocketAddr> {
        self.0.iter().filter(|a| !other.contains(a))
    }

    /// The same list, not only equal ones.
    pub fn shares(&self, other: &Addrs) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A union: the set with those added (a new list; one that others share is left alone).
impl Extend<SocketAddr> for Addrs {
    fn extend<I: IntoIterator<Item = SocketAddr>>(&mut self, more: I) {
        let more: Vec<SocketAddr> = more.into_iter().collect();
        if !more.is_empty() {
            *self = self.iter().copied().chain(more).collect();
        }
    }
}

impl<'a> Extend<&'a SocketAddr> for Addrs {
    fn extend<I: IntoIterator<Item = &'a SocketAddr>>(&mut self, more: I) {
        self.extend(more.into_iter().copied());
    }
}

impl<const N: usize> From<[SocketAddr; N]> for Addrs {
    fn from(a: [SocketAddr; N]) -> Self {
        a.into_iter().collect()
    }
}

impl FromIterator<SocketAddr> for Addrs {
    fn from_iter<I: IntoIterator<Item = SocketAddr>>(iter: I) -> Self {
        let mut v: Vec<SocketAddr> = iter.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Addrs(v.into())
    }
}

impl<'a> IntoIterator for &'a Addrs {
    type Item = &'a SocketAddr;
    type IntoIter = std::slice::Iter<'a, SocketAddr>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// A service's claims by service port name, sorted by name, in one allocation.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ports(Box<[(Box<str>, Claim)]>);

impl Ports {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| (**n).cmp(name))
    }

    pub fn get(&self, name: &str) -> Option<&Claim> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }

    /// Records `claim` under `name`, replacing what was there.
    pub fn insert(&mut self, name: &str, claim: Claim) {
        match self.find(name) {
            Ok(i) => self.0[i].1 = claim,
            Err(i) => {
                let mut v = std::mem::take(&mut self.0).into_vec();
                v.insert(i, (name.into(), claim));
                self.0 = v.into_boxed_slice();
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Claim)> {
        self.0.iter().map(|(n, c)| (&**n, c))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut Claim)> {
        self.0.iter_mut().map(|(n, c)| (&**n, c))
    }

    pub fn values(&self) -> impl Iterator<Item = &Claim> {
        self.0.iter().map(|(_, c)| c)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl std::ops::Index<&str> for Ports {
    type Output = Claim;
    fn index(&self, name: &str) -> &Claim {
        self.get(name).expect("no claim under this port name")
    }
}

#[cfg(test)]
mod tests {
    use super::{Addrs, Claim, Ports};
    use std::net::SocketAddr;
    use testkit::rng::Rng;

    /// Over generated inserts, `Ports` says what a `BTreeMap` would, and `Addrs` what a
    /// `BTreeSet` would.
    #[test]
    fn ports_and_addrs_behave_as_the_sorted_maps_they_replace() {
        for seed in 0..200 {
            let rng = &mut Rng(seed);
            let mut ports = Ports::default();
            let mut map = std::collections::BTreeMap::new();
            for _ in 0..rng.below(8) {
                let name = rng.pick(&["", "a", "dns", "b"]);
                let addrs: Vec<SocketAddr> = (0..rng.below(5))
                    .map(|_| SocketAddr::from(([10, 0, 0, rng.below(4) as u8], 53)))
                    .collect();
                let set: std::collections::BTreeSet<_> = addrs.iter().copied().collect();
                let claim = Claim {
                    serving: addrs.into_iter().collect::<Addrs>(),
                    ..Claim::default()
                };
                assert!(claim.serving.iter().eq(set.iter()), "seed {seed}");
                assert_eq!(claim.serving.len(), set.len());
                for a in &set {
                    assert!(claim.serving.contains(a));
                }
                ports.insert(name, claim.clone());
                map.insert(name.to_string(), claim);
            }
            assert!(
                ports
                    .iter()
                    .map(|(n, c)| (n.to_string(), c))
                    .eq(map.iter().map(|(n, c)| (n.clone(), c)))
            );
            assert_eq!(ports.len(), map.len());
            assert_eq!(ports.is_empty(), map.is_empty());
            for n in ["", "a", "dns", "b", "zz"] {
                assert_eq!(ports.get(n), map.get(n), "seed {seed} {n:?}");
            }
        }
    }
}
