//! The IP family, in the one form every part of the cleanup uses (the kernel's `AF_*` number
//! appears only where msg.rs encodes a request).

use std::net::IpAddr;

/// IPv4 or IPv6: a pass, a model half, a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// In the order a round cleans them.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of `ip` as written (an IPv4-mapped IPv6 address is IPv6, as the kernel has it).
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    pub fn holds(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_))
        )
    }

    /// `IPv4` / `IPv6`: an EndpointSlice's `addressType` and the `ip_family` metric label.
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// Position in per-family arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// One value per family, indexed by [`Family`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PerFamily<T>(pub [T; 2]);

impl<T> std::ops::Index<Family> for PerFamily<T> {
    type Output = T;
    fn index(&self, f: Family) -> &T {
        &self.0[f.index()]
    }
}

impl<T> std::ops::IndexMut<Family> for PerFamily<T> {
    fn index_mut(&mut self, f: Family) -> &mut T {
        &mut self.0[f.index()]
    }
}

impl<T> PerFamily<T> {
    pub fn iter(&self) -> impl Iterator<Item = (Family, &T)> {
        Family::ALL.into_iter().zip(self.0.iter())
    }
}
