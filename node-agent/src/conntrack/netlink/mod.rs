//! A conntrack-over-netlink client with no Kubernetes in it: the part of the kernel's ABI the
//! cleanup speaks, and nothing of services, models or the apiserver.
//!
//! What of the kernel's ABI it covers (uapi `linux/netlink.h`, `linux/netfilter/nfnetlink.h`,
//! `linux/netfilter/nfnetlink_conntrack.h`):
//! - a `NETLINK_NETFILTER` socket with `NETLINK_CAP_ACK`, requests batched per `sendmsg` with
//!   `NLM_F_ACK`, answers read as `NLMSG_ERROR` / `NLMSG_DONE` / `NLMSG_OVERRUN`, a dump's
//!   `NLM_F_MULTI` parts and its `NLM_F_DUMP_INTR` inconsistency flag (`socket.rs`);
//! - ctnetlink (`NFNL_SUBSYS_CTNETLINK`) `IPCTNL_MSG_CT_GET` dumps, `IPCTNL_MSG_CT_DELETE` by
//!   original tuple + `CTA_ID` (+ `CTA_ZONE`), and `IPCTNL_MSG_CT_NEW` (tests and the benchmark
//!   only) (`msg.rs`);
//! - the attributes read from an entry: `CTA_TUPLE_ORIG`, `CTA_TUPLE_REPLY` (`CTA_IP_V4_*`,
//!   `CTA_IP_V6_*`, `CTA_PROTO_NUM`, `CTA_PROTO_{SRC,DST}_PORT`), `CTA_ID`, `CTA_ZONE`; the
//!   rest are skipped, malformed ones are a `ParseError`, never a panic; a create also writes
//!   `CTA_TIMEOUT`, `CTA_STATUS` and `CTA_PROTOINFO_TCP_STATE` (`msg.rs`);
//! - `CTA_FILTER` (kernel 5.8+) on the original protocol, destination address and port and the
//!   reply source, IPv4 addresses only (kernel 6.18 inverts the IPv6 address match); a kernel
//!   that rejects it answers EINVAL / EOPNOTSUPP (`filter.rs`, `msg.rs`);
//! - the family as `nfgenmsg` carries it, `AF_INET` / `AF_INET6` (`family.rs`), and the host's
//!   own addresses through `getifaddrs` (`socket.rs`).
//!
//! Its tests are beside it: `msg_tests.rs` (encoding and parsing, captured and malformed bytes)
//! and `socket.rs`'s (the dump reader against scripted datagrams). The passes over a real
//! kernel table are `conntrack/kernel_tests.rs`.

pub mod family;
pub mod filter;
pub mod msg;
pub mod socket;

#[cfg(test)]
mod msg_tests;
