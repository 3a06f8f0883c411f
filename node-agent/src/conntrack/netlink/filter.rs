//! Dump requests and their kernel-side filter (CTA_FILTER): which entries a filtered dump
//! returns beside the protocol, how the request asks for them, and the same match in Rust for
//! tables that cannot filter.

use std::net::{IpAddr, Ipv4Addr};

use super::family::Family;
use super::msg::*;

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

impl Encoder {
    /// A dump of one family's table; with `only_proto`, a kernel-side filter on the original
    /// tuple's L4 protocol. The filter never carries addresses: on kernel 6.18 the CTA_FILTER
    /// match on IPv6 addresses is inverted.
    pub fn dump(&mut self, seq: u32, family: Family, only_proto: Option<u8>) {
        self.begin(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, family);
        if let Some(proto) = only_proto {
            self.filter(proto, None);
        }
        self.end();
    }

    /// A dump of the `family` entries of `proto` that `select` picks, both filtered by the
    /// kernel. Address selections are IPv4 only: kernel 6.18 inverts the CTA_FILTER match on
    /// IPv6 addresses (a port alone is fine in both families).
    pub fn dump_select(&mut self, seq: u32, family: Family, proto: u8, select: Select) {
        self.begin(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, family);
        self.filter(proto, Some(select));
        self.end();
    }

    /// CTA_FILTER on the original tuple's protocol and what `select` adds, followed by the
    /// values to match (the kernel reads only the attributes the flags name).
    fn filter(&mut self, proto: u8, select: Option<Select>) {
        let (orig, reply) = match select {
            None => (0, 0),
            Some(Select::ReplySource(_)) => (0, CTA_FILTER_FLAG_IP_SRC),
            Some(Select::OrigDst(..)) => {
                (CTA_FILTER_FLAG_IP_DST | CTA_FILTER_FLAG_PROTO_DST_PORT, 0)
            }
            Some(Select::OrigDstPort(_)) => (CTA_FILTER_FLAG_PROTO_DST_PORT, 0),
        };
        self.nest(CTA_FILTER);
        self.put(
            CTA_FILTER_ORIG_FLAGS,
            &(CTA_FILTER_FLAG_PROTO_NUM | orig).to_ne_bytes(),
        );
        if reply != 0 {
            self.put(CTA_FILTER_REPLY_FLAGS, &reply.to_ne_bytes());
        }
        self.unnest();
        self.nest(CTA_TUPLE_ORIG);
        if let Some(Select::OrigDst(ip, _)) = select {
            self.nest(CTA_TUPLE_IP);
            self.put(CTA_IP_V4_DST, &ip.octets());
            self.unnest();
        }
        self.nest(CTA_TUPLE_PROTO);
        self.put(CTA_PROTO_NUM, &[proto]);
        if let Some(Select::OrigDst(_, port) | Select::OrigDstPort(port)) = select {
            self.put(CTA_PROTO_DST_PORT, &port.to_be_bytes());
        }
        self.unnest();
        self.unnest();
        if let Some(Select::ReplySource(src)) = select {
            self.nest(CTA_TUPLE_REPLY);
            self.nest(CTA_TUPLE_IP);
            self.put(CTA_IP_V4_SRC, &src.octets());
            self.unnest();
            self.unnest();
        }
    }
}
