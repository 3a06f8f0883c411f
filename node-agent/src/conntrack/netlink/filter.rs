//! The kernel-side filter of a dump (CTA_FILTER): which entries a filtered dump returns beside
//! the protocol, and the same match in Rust for tables that cannot filter.

use std::net::{IpAddr, Ipv4Addr};

use super::msg::Entry;

/// Which entries a kernel-filtered dump returns (beside the protocol), for a triggered pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Select {
    /// IPv4 entries whose reply comes from this address (where they were DNATed to).
    ReplySource(Ipv4Addr),
    /// IPv4 entries originally addressed to this address and port (a frontend).
    OrigDst(Ipv4Addr, u16),
    /// Entries originally addressed to this port, any address (a nodePort, or a frontend
    /// port on several addresses or in IPv6).
    OrigDstPort(u16),
}

impl Select {
    /// Whether `e` is one the kernel returns for this selection.
    pub fn matches(&self, e: &Entry) -> bool {
        match *self {
            Select::ReplySource(ip) => e.reply.src == IpAddr::V4(ip),
            Select::OrigDst(ip, port) => e.orig.dst == IpAddr::V4(ip) && e.orig.dst_port == port,
            Select::OrigDstPort(port) => e.orig.dst_port == port,
        }
    }
}
