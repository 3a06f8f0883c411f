//! IP prefixes and addresses as upstream's helpers (`pkg/api/servicecidr`) see them.
//!
//! Go `netip` semantics: an address keeps its written family (an IPv4-mapped name is IPv6),
//! and `PrefixContainsIP` excludes network and IPv4 broadcast addresses.

use std::{fmt, net::IpAddr, str::FromStr};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The value of the `ipaddress.kubernetes.io/ip-family` label.
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    pub fn from_label(s: &str) -> Option<Family> {
        match s {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        }
    }

    pub fn width(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// An address as a family and its value; IPv4 lives in the low 32 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    pub family: Family,
    pub value: u128,
}

impl Addr {
    /// Parses an IPAddress object's name as upstream does, with `netip.ParseAddr`: an
    /// IPv4-mapped name (`::ffff:a.b.c.d`) stays IPv6 (Go's 4in6), so no IPv4 prefix contains
    /// it. (`IPToAddr`, which unmaps, is only used upstream on `net.IP` values, never on names.)
    /// `None` for anything that is not an IP.
    pub fn parse(s: &str) -> Option<Addr> {
        IpAddr::from_str(s).ok().map(Addr::from)
    }

    pub fn to_ip(self) -> IpAddr {
        match self.family {
            // The value of a V4 address always fits: it is built from a u32.
            Family::V4 => IpAddr::V4((self.value as u32).into()),
            Family::V6 => IpAddr::V6(self.value.into()),
        }
    }
}

/// The address keeps its written family: Go's `netip` never unmaps on its own.
impl From<IpAddr> for Addr {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Addr {
                family: Family::V4,
                value: u128::from(u32::from(v4)),
            },
            IpAddr::V6(v6) => Addr {
                family: Family::V6,
                value: u128::from(v6),
            },
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_ip().fmt(f)
    }
}

/// A CIDR as written (`addr/bits`); the address need not be masked, as with `netip.ParsePrefix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prefix {
    pub addr: Addr,
    pub bits: u8,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    #[error("{0:?} is not a CIDR: no '/'")]
    NoSlash(String),
    #[error("{0:?} is not a CIDR: bad address")]
    BadAddr(String),
    #[error("{0:?} is not a CIDR: bad prefix length")]
    BadBits(String),
}

impl FromStr for Prefix {
    type Err = PrefixError;

    /// As Go's `netip.ParsePrefix`: the address keeps its written family (an IPv4-mapped IPv6
    /// prefix stays IPv6), the length is plain decimal without sign or leading zeros.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, b) = s
            .split_once('/')
            .ok_or_else(|| PrefixError::NoSlash(s.into()))?;
        let ip = IpAddr::from_str(a).map_err(|_| PrefixError::BadAddr(s.into()))?;
        let addr = Addr::from(ip);
        let plain_decimal = !b.is_empty()
            && b.bytes().all(|c| c.is_ascii_digit())
            && (b == "0" || !b.starts_with('0'));
        let bits: u8 = match b.parse() {
            Ok(n) if plain_decimal && n <= addr.family.width() => n,
            _ => return Err(PrefixError::BadBits(s.into())),
        };
        Ok(Prefix { addr, bits })
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

impl Prefix {
    pub fn family(&self) -> Family {
        self.addr.family
    }

    /// Host-bit mask within the family's width.
    fn host_mask(&self) -> u128 {
        let host = u32::from(self.family().width() - self.bits);
        if host == 128 {
            u128::MAX
        } else {
            (1u128 << host) - 1
        }
    }

    /// `prefix.Masked().Addr()`.
    pub fn network(&self) -> u128 {
        self.addr.value & !self.host_mask()
    }

    /// The last address of the prefix (all host bits set): `broadcastAddress`.
    pub fn last(&self) -> u128 {
        self.network() | self.host_mask()
    }

    /// `netip.Prefix.Contains`: same family and within the range; no exclusions.
    pub fn contains(&self, a: Addr) -> bool {
        a.family == self.family() && a.value >= self.network() && a.value <= self.last()
    }

    /// `netip.Prefix.Overlaps`.
    pub fn overlaps(&self, o: &Prefix) -> bool {
        if self.family() != o.family() {
            return false;
        }
        let wider = if self.bits <= o.bits { self } else { o };
        let narrower = if self.bits <= o.bits { o } else { self };
        wider.contains(Addr {
            family: narrower.family(),
            value: narrower.network(),
        })
    }

    /// `ContainsPrefix`'s test: `p` overlaps `other` and is equal or larger.
    pub fn covers(&self, other: &Prefix) -> bool {
        self.overlaps(other) && self.bits <= other.bits
    }

    /// The inclusive range of addresses `PrefixContainsIP` accepts, or `None` when it accepts
    /// none (a /32, /31, /128). The network address never counts; for IPv4 the broadcast
    /// address does not either; IPv6 has no broadcast, so its last address counts.
    pub fn usable(&self) -> Option<(u128, u128)> {
        let lo = self.network().checked_add(1)?;
        let hi = match self.family() {
            Family::V4 => self.last().checked_sub(1)?,
            Family::V6 => self.last(),
        };
        (lo <= hi).then_some((lo, hi))
    }

    /// `PrefixContainsIP`.
    pub fn contains_ip(&self, a: Addr) -> bool {
        a.family == self.family()
            && self
                .usable()
                .is_some_and(|(lo, hi)| a.value >= lo && a.value <= hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().unwrap()
    }
    fn a(s: &str) -> Addr {
        Addr::parse(s).unwrap()
    }

    #[test]
    fn parse_accepts_what_netip_accepts() {
        for (s, ok) in [
            ("10.0.0.0/24", true),
            ("10.0.0.7/24", true), // unmasked address is fine, as in Go
            ("0.0.0.0/0", true),
            ("10.0.0.0/32", true),
            ("10.0.0.0/33", false),
            ("10.0.0.0/024", false),
            ("10.0.0.0/+24", false),
            ("10.0.0.0/", false),
            ("10.0.0.0", false),
            ("010.0.0.0/8", false),
            ("fd00::/112", true),
            ("fd00::/129", false),
            ("::ffff:10.0.0.0/104", true),
            ("fe80::1%eth0/64", false),
            ("not-a-cidr", false),
            ("", false),
        ] {
            assert_eq!(s.parse::<Prefix>().is_ok(), ok, "{s}");
        }
        assert_eq!(p("::ffff:10.0.0.0/104").family(), Family::V6);
        let e = "10.0.0.0/33".parse::<Prefix>().unwrap_err().to_string();
        assert!(e.contains("10.0.0.0/33"), "{e}");
    }

    #[test]
    fn ipv4_mapped_names_are_ipv6_as_netip_parses_them() {
        // (name, family, contained in 10.0.0.0/24, contained in ::ffff:10.0.0.0/120)
        for (name, family, in_v4, in_mapped_v6) in [
            ("10.0.0.5", Family::V4, true, false),
            ("::ffff:10.0.0.5", Family::V6, false, true),
            ("::FFFF:10.0.0.5", Family::V6, false, true),
            ("::ffff:a00:5", Family::V6, false, true),
            ("::10.0.0.5", Family::V6, false, false), // IPv4-compatible, not mapped
            ("fd00::5", Family::V6, false, false),
        ] {
            let addr = a(name);
            assert_eq!(addr.family, family, "{name}");
            assert_eq!(p("10.0.0.0/24").contains_ip(addr), in_v4, "{name}");
            assert_eq!(
                p("::ffff:10.0.0.0/120").contains_ip(addr),
                in_mapped_v6,
                "{name}"
            );
        }
        assert_ne!(a("::ffff:10.0.0.5"), a("10.0.0.5"));
        assert!(Addr::parse("10.0.0.256").is_none());
        assert!(Addr::parse("foo").is_none());
    }

    #[test]
    fn prefix_contains_ip_table() {
        for (prefix, ip, want) in [
            // IPv4: network and broadcast never count.
            ("10.0.0.0/24", "10.0.0.0", false),
            ("10.0.0.0/24", "10.0.0.1", true),
            ("10.0.0.0/24", "10.0.0.254", true),
            ("10.0.0.0/24", "10.0.0.255", false),
            ("10.0.0.0/24", "10.0.1.1", false),
            ("10.0.0.9/24", "10.0.0.0", false), // network of the masked prefix
            ("10.0.0.9/24", "10.0.0.9", true),
            ("10.0.0.0/24", "::ffff:10.0.0.7", false), // IPv6 (4in6), as netip.ParseAddr reads it
            ("::ffff:10.0.0.0/120", "::ffff:10.0.0.255", true), // IPv6: no broadcast exclusion
            ("10.0.0.0/31", "10.0.0.0", false),
            ("10.0.0.0/31", "10.0.0.1", false),
            ("10.0.0.0/30", "10.0.0.1", true),
            ("10.0.0.0/30", "10.0.0.3", false),
            ("10.0.0.1/32", "10.0.0.1", false),
            ("0.0.0.0/0", "255.255.255.255", false),
            ("0.0.0.0/0", "0.0.0.0", false),
            ("0.0.0.0/0", "1.2.3.4", true),
            // IPv6: network (subnet-router) excluded, the all-ones address is contained.
            ("fd00::/112", "fd00::", false),
            ("fd00::/112", "fd00::1", true),
            ("fd00::/112", "fd00::ffff", true),
            ("fd00::/112", "fd00::1:0", false),
            ("fd00::1/128", "fd00::1", false),
            ("fd00::/127", "fd00::1", true),
            ("::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", true),
            ("::/0", "::", false),
            // Families never mix: an IPv4-mapped prefix holds IPv4-mapped names (both IPv6), never
            // plain IPv4 ones.
            ("10.0.0.0/24", "fd00::1", false),
            ("::ffff:10.0.0.0/104", "::ffff:10.0.0.5", true),
            ("::ffff:10.0.0.0/104", "10.0.0.5", false),
            ("fd00::/112", "10.0.0.1", false),
        ] {
            assert_eq!(p(prefix).contains_ip(a(ip)), want, "{prefix} ∋ {ip}");
        }
    }

    #[test]
    fn overlaps_and_covers_table() {
        for (x, y, overlaps, x_covers_y) in [
            ("10.0.0.0/16", "10.0.1.0/24", true, true),
            ("10.0.1.0/24", "10.0.0.0/16", true, false),
            ("10.0.0.0/24", "10.0.0.0/24", true, true),
            ("10.0.0.0/24", "10.0.1.0/24", false, false),
            ("10.0.0.0/23", "10.0.1.0/24", true, true),
            ("10.0.0.5/16", "10.0.200.0/24", true, true),
            ("0.0.0.0/0", "192.168.0.0/16", true, true),
            ("10.0.0.0/8", "fd00::/8", false, false),
            ("fd00::/64", "fd00::/112", true, true),
            ("fd00::/112", "fd00::1:0/112", false, false),
        ] {
            assert_eq!(p(x).overlaps(&p(y)), overlaps, "{x} overlaps {y}");
            assert_eq!(p(y).overlaps(&p(x)), overlaps, "{y} overlaps {x}");
            assert_eq!(p(x).covers(&p(y)), x_covers_y, "{x} covers {y}");
        }
    }

    #[test]
    fn usable_ranges() {
        assert_eq!(
            p("10.0.0.0/30").usable(),
            Some((u128::from(0x0a00_0001u32), u128::from(0x0a00_0002u32)))
        );
        assert_eq!(p("10.0.0.0/31").usable(), None);
        assert_eq!(p("10.0.0.0/32").usable(), None);
        assert_eq!(p("::/0").usable(), Some((1, u128::MAX)));
        assert_eq!(p("fd00::/128").usable(), None);
    }
}
