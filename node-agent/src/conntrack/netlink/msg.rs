//! The few ctnetlink messages node-agent speaks, encoded and parsed by hand: a dump request
//! (optionally filtered to one L4 protocol), a delete by original tuple + ID, and a create
//! (for tests and the benchmark). The parser reads only the attributes the cleanup needs and
//! returns an error, never panics, on malformed input.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::family::Family;

pub const NLMSG_HDRLEN: usize = 16;
// Control messages the kernel answers with.
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLMSG_OVERRUN: u16 = 4;
// Flags of a request.
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_DUMP: u16 = 0x300;
// Flags the kernel sets on the parts of a dump.
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_DUMP_INTR: u16 = 0x10;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

// nfnetlink / ctnetlink
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
pub(super) const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const NFGENMSG_LEN: usize = 4;

pub(super) const CTA_TUPLE_ORIG: u16 = 1;
pub(super) const CTA_TUPLE_REPLY: u16 = 2;
#[cfg(any(test, feature = "testing"))]
pub(super) const CTA_STATUS: u16 = 3;
#[cfg(any(test, feature = "testing"))]
pub(super) const CTA_PROTOINFO: u16 = 4;
#[cfg(any(test, feature = "testing"))]
pub(super) const CTA_TIMEOUT: u16 = 7;
pub(super) const CTA_ID: u16 = 12;
pub(super) const CTA_ZONE: u16 = 18;
pub(super) const CTA_FILTER: u16 = 25;

pub(super) const CTA_TUPLE_IP: u16 = 1;
pub(super) const CTA_TUPLE_PROTO: u16 = 2;
pub(super) const CTA_IP_V4_SRC: u16 = 1;
pub(super) const CTA_IP_V4_DST: u16 = 2;
pub(super) const CTA_IP_V6_SRC: u16 = 3;
pub(super) const CTA_IP_V6_DST: u16 = 4;
pub(super) const CTA_PROTO_NUM: u16 = 1;
pub(super) const CTA_PROTO_SRC_PORT: u16 = 2;
pub(super) const CTA_PROTO_DST_PORT: u16 = 3;
#[cfg(any(test, feature = "testing"))]
pub(super) const CTA_PROTOINFO_TCP: u16 = 1;
#[cfg(any(test, feature = "testing"))]
pub(super) const CTA_PROTOINFO_TCP_STATE: u16 = 1;
pub(super) const CTA_FILTER_ORIG_FLAGS: u16 = 1;
pub(super) const CTA_FILTER_REPLY_FLAGS: u16 = 2;
pub(super) const CTA_FILTER_FLAG_IP_SRC: u32 = 1 << 0;
pub(super) const CTA_FILTER_FLAG_IP_DST: u32 = 1 << 1;
pub(super) const CTA_FILTER_FLAG_PROTO_NUM: u32 = 1 << 3;
pub(super) const CTA_FILTER_FLAG_PROTO_DST_PORT: u32 = 1 << 5;

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_SCTP: u8 = 132;
/// [`Family`] as nfgenmsg carries it; nowhere else is the family a number.
pub(super) const AF_INET: u8 = 2;
pub(super) const AF_INET6: u8 = 10;

fn af(family: Family) -> u8 {
    match family {
        Family::V4 => AF_INET,
        Family::V6 => AF_INET6,
    }
}

/// The ctnetlink message type of a conntrack entry in a dump reply.
pub const CT_NEW_TYPE: u16 = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("netlink message truncated: {what} needs {need} bytes, {have} left")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("netlink attribute {what} has length {len}, expected {expected}")]
    BadLength {
        what: &'static str,
        len: usize,
        expected: &'static str,
    },
    #[error("conntrack entry lacks {0}")]
    Missing(&'static str),
    #[error("conntrack tuple mixes IPv4 and IPv6 addresses")]
    MixedFamily,
}

/// One direction of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

/// The part of a conntrack entry the cleanup reads, and what it needs to delete exactly it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entry {
    pub orig: Tuple,
    pub reply: Tuple,
    /// The kernel's per-entry ID: deleting by tuple + ID leaves a same-tuple successor alone.
    pub id: Option<u32>,
    pub zone: u16,
}

impl Entry {
    /// An entry of the shape kube-proxy's DNAT creates: `client -> frontend` in the original
    /// direction, `endpoint -> client` in the reply. No ID (the kernel assigns one), zone 0.
    #[cfg(any(test, feature = "testing"))]
    pub fn dnat(
        proto: u8,
        client: std::net::SocketAddr,
        frontend: std::net::SocketAddr,
        endpoint: std::net::SocketAddr,
    ) -> Self {
        Entry {
            orig: Tuple {
                src: client.ip(),
                dst: frontend.ip(),
                proto,
                src_port: client.port(),
                dst_port: frontend.port(),
            },
            reply: Tuple {
                src: endpoint.ip(),
                dst: client.ip(),
                proto,
                src_port: endpoint.port(),
                dst_port: client.port(),
            },
            id: None,
            zone: 0,
        }
    }
}

impl Tuple {
    pub fn family(&self) -> Family {
        Family::of(self.src)
    }
}

impl fmt::Display for Tuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "proto={} {} -> {}",
            self.proto,
            std::net::SocketAddr::new(self.src, self.src_port),
            std::net::SocketAddr::new(self.dst, self.dst_port)
        )
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "orig[{}] reply[{}]", self.orig, self.reply)?;
        if let Some(id) = self.id {
            write!(f, " id={id}")?;
        }
        if self.zone != 0 {
            write!(f, " zone={}", self.zone)?;
        }
        Ok(())
    }
}

/// One netlink message inside a receive buffer.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn take<'a>(buf: &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], ParseError> {
    buf.get(..n).ok_or(ParseError::Truncated {
        what,
        need: n,
        have: buf.len(),
    })
}

fn u16_ne(b: &[u8]) -> u16 {
    u16::from_ne_bytes([b[0], b[1]])
}

fn u32_ne(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

/// Iterates the netlink messages of one `recv`; a malformed header ends it with an error.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = Result<Message<'_>, ParseError>> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let parsed = (|| {
            let hdr = take(rest, NLMSG_HDRLEN, "netlink header")?;
            let len = u32_ne(&hdr[0..4]) as usize;
            if len < NLMSG_HDRLEN {
                return Err(ParseError::BadLength {
                    what: "nlmsg_len",
                    len,
                    expected: ">= 16",
                });
            }
            let whole = take(rest, len, "netlink message")?;
            let msg = Message {
                ty: u16_ne(&hdr[4..6]),
                flags: u16_ne(&hdr[6..8]),
                seq: u32_ne(&hdr[8..12]),
                payload: &whole[NLMSG_HDRLEN..],
            };
            Ok((msg, align4(len).min(rest.len())))
        })();
        match parsed {
            Ok((msg, advance)) => {
                rest = &rest[advance..];
                Some(Ok(msg))
            }
            Err(e) => {
                rest = &[];
                Some(Err(e))
            }
        }
    })
}

/// The errno of an `NLMSG_ERROR` payload (0 = acknowledgement), as a positive number.
pub fn error_code(payload: &[u8]) -> Result<i32, ParseError> {
    let b = take(payload, 4, "nlmsgerr")?;
    Ok(-i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// Iterates the attributes of one attribute block.
pub(super) fn attrs(buf: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), ParseError>> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            // Trailing bytes shorter than an attribute header are padding.
            return None;
        }
        let len = u16_ne(&rest[0..2]) as usize;
        let ty = u16_ne(&rest[2..4]) & NLA_TYPE_MASK;
        if len < 4 {
            rest = &[];
            return Some(Err(ParseError::BadLength {
                what: "nlattr",
                len,
                expected: ">= 4",
            }));
        }
        match take(rest, len, "netlink attribute") {
            Ok(whole) => {
                let value = &whole[4..];
                rest = &rest[align4(len).min(rest.len())..];
                Some(Ok((ty, value)))
            }
            Err(e) => {
                rest = &[];
                Some(Err(e))
            }
        }
    })
}

fn exact<'a>(v: &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], ParseError> {
    if v.len() != n {
        return Err(ParseError::BadLength {
            what,
            len: v.len(),
            expected: match n {
                1 => "1",
                2 => "2",
                4 => "4",
                _ => "16",
            },
        });
    }
    Ok(v)
}

fn be16(v: &[u8], what: &'static str) -> Result<u16, ParseError> {
    let b = exact(v, 2, what)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

fn be32(v: &[u8], what: &'static str) -> Result<u32, ParseError> {
    let b = exact(v, 4, what)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn ip4(v: &[u8]) -> Result<IpAddr, ParseError> {
    let b = exact(v, 4, "CTA_IP_V4")?;
    Ok(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])))
}

fn ip6(v: &[u8]) -> Result<IpAddr, ParseError> {
    let b: [u8; 16] = exact(v, 16, "CTA_IP_V6")?
        .try_into()
        .map_err(|_| ParseError::Missing("16-byte IPv6 address"))?;
    Ok(IpAddr::V6(Ipv6Addr::from(b)))
}

pub(super) fn parse_tuple(buf: &[u8]) -> Result<Tuple, ParseError> {
    let (mut src, mut dst, mut proto) = (None, None, None);
    let (mut src_port, mut dst_port) = (None, None);
    for a in attrs(buf) {
        let (ty, v) = a?;
        match ty {
            CTA_TUPLE_IP => {
                for a in attrs(v) {
                    let (ty, v) = a?;
                    match ty {
                        CTA_IP_V4_SRC => src = Some(ip4(v)?),
                        CTA_IP_V4_DST => dst = Some(ip4(v)?),
                        CTA_IP_V6_SRC => src = Some(ip6(v)?),
                        CTA_IP_V6_DST => dst = Some(ip6(v)?),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for a in attrs(v) {
                    let (ty, v) = a?;
                    match ty {
                        CTA_PROTO_NUM => proto = Some(exact(v, 1, "CTA_PROTO_NUM")?[0]),
                        CTA_PROTO_SRC_PORT => src_port = Some(be16(v, "CTA_PROTO_SRC_PORT")?),
                        CTA_PROTO_DST_PORT => dst_port = Some(be16(v, "CTA_PROTO_DST_PORT")?),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let src = src.ok_or(ParseError::Missing("source address"))?;
    let dst = dst.ok_or(ParseError::Missing("destination address"))?;
    if src.is_ipv4() != dst.is_ipv4() {
        return Err(ParseError::MixedFamily);
    }
    let proto = proto.ok_or(ParseError::Missing("CTA_PROTO_NUM"))?;
    let has_ports = matches!(proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP);
    let (src_port, dst_port) = match (src_port, dst_port) {
        (Some(s), Some(d)) => (s, d),
        _ if has_ports => return Err(ParseError::Missing("ports of a TCP/UDP/SCTP tuple")),
        _ => (0, 0),
    };
    Ok(Tuple {
        src,
        dst,
        proto,
        src_port,
        dst_port,
    })
}

/// Parses the payload (after the netlink header) of a conntrack entry message.
pub fn parse_entry(payload: &[u8]) -> Result<Entry, ParseError> {
    let attrs_buf = payload.get(NFGENMSG_LEN..).ok_or(ParseError::Truncated {
        what: "nfgenmsg",
        need: NFGENMSG_LEN,
        have: payload.len(),
    })?;
    let (mut orig, mut reply, mut id, mut zone) = (None, None, None, 0);
    for a in attrs(attrs_buf) {
        let (ty, v) = a?;
        match ty {
            CTA_TUPLE_ORIG => orig = Some(parse_tuple(v)?),
            CTA_TUPLE_REPLY => reply = Some(parse_tuple(v)?),
            CTA_ID => id = Some(be32(v, "CTA_ID")?),
            CTA_ZONE => zone = be16(v, "CTA_ZONE")?,
            _ => {}
        }
    }
    Ok(Entry {
        orig: orig.ok_or(ParseError::Missing("CTA_TUPLE_ORIG"))?,
        reply: reply.ok_or(ParseError::Missing("CTA_TUPLE_REPLY"))?,
        id,
        zone,
    })
}

/// Appends netlink messages to one buffer, so several requests can go in one `sendmsg`.
#[derive(Default)]
pub struct Encoder {
    pub buf: Vec<u8>,
    nests: Vec<usize>,
    msg_start: usize,
}

impl Encoder {
    pub fn clear(&mut self) {
        self.buf.clear();
        self.nests.clear();
    }

    pub(super) fn begin(&mut self, msg: u16, flags: u16, seq: u32, family: Family) {
        self.msg_start = self.buf.len();
        let ty = (NFNL_SUBSYS_CTNETLINK << 8) | msg;
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
        self.buf.extend_from_slice(&[af(family), 0, 0, 0]); // nfgenmsg: family, version 0, res_id 0
    }

    pub(super) fn end(&mut self) {
        let len = (self.buf.len() - self.msg_start) as u32;
        self.buf[self.msg_start..self.msg_start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    pub(super) fn put(&mut self, ty: u16, value: &[u8]) {
        let len = (4 + value.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    pub(super) fn nest(&mut self, ty: u16) {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    }

    pub(super) fn unnest(&mut self) {
        let start = self.nests.pop().expect("unnest matches a nest");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn tuple(&mut self, ty: u16, t: &Tuple) {
        self.nest(ty);
        self.nest(CTA_TUPLE_IP);
        match (t.src, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                self.put(CTA_IP_V4_SRC, &s.octets());
                self.put(CTA_IP_V4_DST, &d.octets());
            }
            (s, d) => {
                self.put(CTA_IP_V6_SRC, &v6(s).octets());
                self.put(CTA_IP_V6_DST, &v6(d).octets());
            }
        }
        self.unnest();
        self.nest(CTA_TUPLE_PROTO);
        self.put(CTA_PROTO_NUM, &[t.proto]);
        self.put(CTA_PROTO_SRC_PORT, &t.src_port.to_be_bytes());
        self.put(CTA_PROTO_DST_PORT, &t.dst_port.to_be_bytes());
        self.unnest();
        self.unnest();
    }

    /// Deletes exactly `e`: its original tuple always (a delete without a tuple would flush
    /// the table), its ID when known, its zone when not the default.
    pub fn delete(&mut self, seq: u32, e: &Entry) {
        self.begin(
            IPCTNL_MSG_CT_DELETE,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            e.orig.family(),
        );
        self.tuple(CTA_TUPLE_ORIG, &e.orig);
        if let Some(id) = e.id {
            self.put(CTA_ID, &id.to_be_bytes());
        }
        if e.zone != 0 {
            self.put(CTA_ZONE, &e.zone.to_be_bytes());
        }
        self.end();
    }

    /// Creates an entry (tests and the benchmark fill tables with it). TCP entries are created
    /// ESTABLISHED.
    #[cfg(any(test, feature = "testing"))]
    pub fn create(&mut self, seq: u32, e: &Entry, timeout_secs: u32, status: u32) {
        self.begin(
            IPCTNL_MSG_CT_NEW,
            NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
            seq,
            e.orig.family(),
        );
        self.tuple(CTA_TUPLE_ORIG, &e.orig);
        self.tuple(CTA_TUPLE_REPLY, &e.reply);
        self.put(CTA_TIMEOUT, &timeout_secs.to_be_bytes());
        // The kernel marks a created entry CONFIRMED before applying CTA_STATUS and refuses
        // (EBUSY) a status that would clear the bit.
        self.put(CTA_STATUS, &(status | STATUS_CONFIRMED).to_be_bytes());
        if e.orig.proto == IPPROTO_TCP {
            self.nest(CTA_PROTOINFO);
            self.nest(CTA_PROTOINFO_TCP);
            self.put(CTA_PROTOINFO_TCP_STATE, &[3]); // TCP_CONNTRACK_ESTABLISHED
            self.unnest();
            self.unnest();
        }
        if e.zone != 0 {
            self.put(CTA_ZONE, &e.zone.to_be_bytes());
        }
        self.end();
    }
}

/// Status bits of an answered flow, for entries created by tests and the benchmark.
#[cfg(any(test, feature = "testing"))]
pub const STATUS_SEEN_REPLY: u32 = 1 << 1;
#[cfg(any(test, feature = "testing"))]
pub const STATUS_ASSURED: u32 = 1 << 2;
#[cfg(any(test, feature = "testing"))]
const STATUS_CONFIRMED: u32 = 1 << 3;

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => a.to_ipv6_mapped(),
    }
}
