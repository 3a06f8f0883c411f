//! How the IP index keeps 100k allocator-managed IPAddresses small.
//!
//! Each entry lives once, in a map sorted by address (the order the range queries read): the
//! name is not kept when it is the address's canonical text (the apiserver accepts only those,
//! so it normally is), and an owner's resource and namespace, shared by thousands of IPs, are
//! kept once and pointed to. A name written differently for an address already taken (the
//! same IPv6 address spelled another way) is kept after the first, in the order added, as the
//! index always did.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use super::prefix::{Addr, Family};

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

/// The facts kept of one allocator-managed IPAddress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpAddressFacts {
    /// The object's name as written (it is the IP); the same allocation as the index's key.
    pub name: Arc<str>,
    /// `ipaddress.kubernetes.io/ip-family`; canDelete only sees IPs whose label names the
    /// family of one of the ServiceCIDR's CIDRs, as upstream's label selector does.
    pub family_label: Option<Family>,
    pub owner: Option<Owner>,
}

/// What an owner's IPs share: the resource and namespace of `spec.parentRef`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Scope {
    resource: Box<str>,
    namespace: Option<Box<str>>,
}

#[derive(Debug)]
struct SlotOwner {
    scope: Arc<Scope>,
    name: Box<str>,
}

/// One entry, as kept.
#[derive(Debug)]
pub(super) struct Slot {
    /// The name when it is not `addr`'s canonical text.
    written: Option<Box<str>>,
    family_label: Option<Family>,
    owner: Option<SlotOwner>,
}

/// The name as a slot keeps it: `None` for the canonical text of `addr`.
pub(super) fn written(addr: Addr, name: &str) -> Option<Box<str>> {
    // Formatting into a stack buffer would save an allocation; an IPAddress event is rare
    // enough that it does not matter.
    (addr.to_string() != name).then(|| name.into())
}

impl Slot {
    pub(super) fn name_is(&self, written: Option<&str>) -> bool {
        self.written.as_deref() == written
    }

    /// The entry as the rest of the controller reads it.
    pub(super) fn entry(&self, addr: Addr) -> IpAddressFacts {
        let name: Arc<str> = match &self.written {
            Some(w) => Arc::from(&**w),
            None => addr.to_string().into(),
        };
        IpAddressFacts {
            name,
            family_label: self.family_label,
            owner: self.owner.as_ref().map(|o| Owner {
                resource: o.scope.resource.to_string(),
                namespace: o.scope.namespace.as_deref().map(String::from),
                name: o.name.to_string(),
            }),
        }
    }

    pub(super) fn written(&self) -> Option<&str> {
        self.written.as_deref()
    }

    pub(super) fn family_label(&self) -> Option<Family> {
        self.family_label
    }
}

/// The owners' scopes, each kept once while some entry points to it.
#[derive(Default)]
pub(super) struct Scopes {
    set: HashSet<Arc<Scope>>,
    /// The size after the last sweep of scopes no entry points to any more.
    swept_at: usize,
}

impl Scopes {
    /// The slot for `entry` named `written`.
    pub(super) fn slot(&mut self, entry: IpAddressFacts, written: Option<Box<str>>) -> Slot {
        Slot {
            written,
            family_label: entry.family_label,
            owner: entry.owner.map(|o| SlotOwner {
                scope: self.intern(o.resource, o.namespace),
                name: o.name.into(),
            }),
        }
    }

    fn intern(&mut self, resource: String, namespace: Option<String>) -> Arc<Scope> {
        let scope = Scope {
            resource: resource.into(),
            namespace: namespace.map(Into::into),
        };
        if let Some(s) = self.set.get(&scope) {
            return s.clone();
        }
        // Namespaces come and go: forget the scopes nothing points to before the set doubles,
        // so it stays within twice the live ones.
        if self.set.len() >= 2 * self.swept_at.max(64) {
            self.set.retain(|s| Arc::strong_count(s) > 1);
            self.swept_at = self.set.len();
        }
        let s = Arc::new(scope);
        self.set.insert(s.clone());
        s
    }
}

/// The entries of one family by address.
#[derive(Default)]
pub(super) struct ByAddr {
    first: BTreeMap<u128, Slot>,
    /// The further names at an address already in `first` (rare: see the module doc).
    more: BTreeMap<u128, Vec<Slot>>,
}

impl ByAddr {
    pub(super) fn contains(&self, value: u128, written: Option<&str>) -> bool {
        self.first.get(&value).is_some_and(|s| s.name_is(written))
            || self
                .more
                .get(&value)
                .is_some_and(|v| v.iter().any(|s| s.name_is(written)))
    }

    /// Adds or replaces; true when the name is new.
    pub(super) fn insert(&mut self, value: u128, slot: Slot) -> bool {
        let Some(first) = self.first.get_mut(&value) else {
            self.first.insert(value, slot);
            return true;
        };
        if first.name_is(slot.written.as_deref()) {
            *first = slot;
            return false;
        }
        let more = self.more.entry(value).or_default();
        match more.iter_mut().find(|s| s.name_is(slot.written.as_deref())) {
            Some(s) => {
                *s = slot;
                false
            }
            None => {
                more.push(slot);
                true
            }
        }
    }

    /// True when the name was there.
    pub(super) fn remove(&mut self, value: u128, written: Option<&str>) -> bool {
        if self.first.get(&value).is_some_and(|s| s.name_is(written)) {
            // The next name at this address, if any, moves up: the order added is kept.
            let mut next = None;
            if let Some(more) = self.more.get_mut(&value) {
                next = Some(more.remove(0));
                if more.is_empty() {
                    self.more.remove(&value);
                }
            }
            match next {
                Some(n) => {
                    self.first.insert(value, n);
                }
                None => {
                    self.first.remove(&value);
                }
            }
            return true;
        }
        let Some(more) = self.more.get_mut(&value) else {
            return false;
        };
        let Some(i) = more.iter().position(|s| s.name_is(written)) else {
            return false;
        };
        more.remove(i);
        if more.is_empty() {
            self.more.remove(&value);
        }
        true
    }

    /// Every entry with an address in `lo..=hi`, by address, in the order added at each.
    pub(super) fn range(&self, lo: u128, hi: u128) -> impl Iterator<Item = (u128, &Slot)> {
        self.first.range(lo..=hi).flat_map(move |(v, s)| {
            let more = if self.more.is_empty() {
                None
            } else {
                self.more.get(v)
            };
            std::iter::once((*v, s)).chain(more.into_iter().flatten().map(move |m| (*v, m)))
        })
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u128, &Slot)> {
        self.range(0, u128::MAX)
    }
}

/// Both families' entries and their count.
#[derive(Default)]
pub(super) struct Entries {
    v4: ByAddr,
    v6: ByAddr,
    len: usize,
}

impl Entries {
    pub(super) fn family(&self, f: Family) -> &ByAddr {
        match f {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    fn family_mut(&mut self, f: Family) -> &mut ByAddr {
        match f {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn contains(&self, addr: Addr, written: Option<&str>) -> bool {
        self.family(addr.family).contains(addr.value, written)
    }

    /// True when the name is new.
    pub(super) fn insert(&mut self, addr: Addr, slot: Slot) -> bool {
        let new = self.family_mut(addr.family).insert(addr.value, slot);
        self.len += usize::from(new);
        new
    }

    pub(super) fn remove(&mut self, addr: Addr, written: Option<&str>) -> bool {
        let was = self.family_mut(addr.family).remove(addr.value, written);
        self.len -= usize::from(was);
        was
    }

    /// Every entry with its address.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Addr, &Slot)> {
        let v4 = self.v4.iter().map(|(value, s)| {
            let a = Addr {
                family: Family::V4,
                value,
            };
            (a, s)
        });
        let v6 = self.v6.iter().map(|(value, s)| {
            let a = Addr {
                family: Family::V6,
                value,
            };
            (a, s)
        });
        v4.chain(v6)
    }
}
