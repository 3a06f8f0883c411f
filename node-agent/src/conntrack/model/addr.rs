//! Addresses and service IP ranges as kube-proxy reads them from objects (Go's `net.IP`
//! equalities, `ParseIPSloppy`'s leading zeros), for the facts and the model alike.

use std::net::IpAddr;

/// A ServiceCIDR's `spec.cidrs` item as kube-proxy matches addresses against it: an
/// IPv4-mapped IPv6 address counts as IPv4 (Go's `net.IP`). Not the controller-manager's
/// `servicecidr::prefix::Prefix`, which keeps Go `netip`'s written family on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceIpRange {
    pub addr: IpAddr,
    pub len: u8,
}

impl ServiceIpRange {
    /// `10.96.0.0/16`, `fd00:10:96::/112`; `None` for anything else (never a panic).
    pub fn parse(s: &str) -> Option<Self> {
        let (a, l) = s.trim().split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        if l.is_empty() || !l.bytes().all(|b| b.is_ascii_digit()) || l.len() > 3 {
            return None;
        }
        let len: u8 = l.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (len <= max).then_some(Self { addr, len })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| -> (u128, u32) {
            match ip {
                IpAddr::V4(v) => (u128::from(u32::from(v)), 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        };
        let ip = canonical(ip);
        let ((net, w1), (x, w2)) = (bits(self.addr), bits(ip));
        if w1 != w2 {
            return false;
        }
        let host_bits = w1 - u32::from(self.len);
        if host_bits >= 128 {
            return true; // ::/0
        }
        (net >> host_bits) == (x >> host_bits)
    }
}

/// Go's `net.IP.String()` prints an IPv4-mapped IPv6 address as IPv4; comparing canonical
/// forms keeps the same equalities.
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Parses an address as kube-proxy would use it; mapped IPv6 compares as IPv4 (like Go's
/// `net.IP.String()`), so the family check uses the canonical form. Like `ParseIPSloppy`,
/// IPv4 octets with leading zeros are read as decimal (objects validated by older apiservers
/// may hold them): dropping such an endpoint would make its live flows look stale.
pub(super) fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| parse_ipv4_leading_zeros(s))
        .map(canonical)
}

fn parse_ipv4_leading_zeros(s: &str) -> Option<IpAddr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let p = parts.next()?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    parts.next().is_none().then(|| IpAddr::from(octets))
}
