//! A blocking ctnetlink socket over raw `libc`: stream a dump through a reusable buffer, and
//! send deletes/creates in batches, counting acknowledgements. A socket belongs to the network
//! namespace of the thread that opened it.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::family::Family;
use super::filter::Select;
use super::msg::{self, Encoder, Entry, Message, ParseError};

const NETLINK_NETFILTER: libc::c_int = 12;
const NETLINK_CAP_ACK: libc::c_int = 10;
const SOL_NETLINK: libc::c_int = 270;
/// Dump replies come in skbs of at most ~32 KiB; twice that leaves room without MSG_TRUNC.
const RECV_BUF: usize = 64 * 1024;
/// Requests per `sendmsg`; small enough that the acknowledgements fit the receive buffer.
const BATCH: usize = 128;
/// Creates per `sendmsg` (tests, benchmark): only failures are acknowledged, one by one.
#[cfg(any(test, feature = "testing"))]
const CREATE_BATCH: usize = 512;
const RECV_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The netlink socket could not be opened (needs CAP_NET_ADMIN): nothing was read.
    #[error("opening the conntrack netlink socket: {0}")]
    Open(io::Error),
    /// The kernel reported the dump inconsistent (NLM_F_DUMP_INTR) or EINTR: retry it.
    #[error("conntrack dump interrupted (EINTR / NLM_F_DUMP_INTR)")]
    Interrupted,
    /// The kernel does not accept CTA_FILTER for this dump (EINVAL / EOPNOTSUPP).
    #[error("kernel rejected the conntrack dump filter: {0}")]
    FilterRejected(io::Error),
    #[error("conntrack dump failed: {0}")]
    Kernel(io::Error),
    #[error("reading the conntrack dump: {0}")]
    Io(io::Error),
    #[error("malformed conntrack dump message: {0}")]
    Parse(#[from] ParseError),
}

/// How a batch of requests ended, request by request.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchReport {
    pub ok: usize,
    /// ENOENT: for a delete, the entry is already gone (or was replaced: different ID).
    pub not_found: usize,
    /// Other per-request errors: (index in the batch, errno).
    pub failed: Vec<(usize, i32)>,
}

/// Which requests of a batch the kernel acknowledges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acks {
    /// Every one (NLM_F_ACK on each): deletes, whose outcome is counted one by one.
    Each,
    /// Only those that failed, and the last of each `sendmsg`.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    Failures,
}

pub struct Conntrack {
    fd: OwnedFd,
    buf: Vec<u8>,
    enc: Encoder,
    seq: u32,
}

fn check(ret: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if ret < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(ret)
}

fn setsockopt<T>(fd: libc::c_int, level: libc::c_int, name: libc::c_int, v: &T) -> libc::c_int {
    // SAFETY: `v` points to a live T of the size passed.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (v as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    }
}

impl Conntrack {
    /// Opens a NETLINK_NETFILTER socket in the calling thread's network namespace.
    /// Needs CAP_NET_ADMIN for anything but reading.
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain syscall; the fd is owned right away.
        let raw = check(
            unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    NETLINK_NETFILTER,
                )
            },
            "socket(AF_NETLINK, NETLINK_NETFILTER)",
        )?;
        // SAFETY: `raw` is a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: zeroed sockaddr_nl is valid; pid 0 lets the kernel pick the port id.
        let mut addr: libc::sockaddr_nl = unsafe { mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        check(
            // SAFETY: addr is a valid sockaddr_nl of the size passed.
            unsafe {
                libc::bind(
                    raw,
                    (&addr as *const libc::sockaddr_nl).cast(),
                    mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            },
            "bind(netlink)",
        )?;
        let rcvbuf: libc::c_int = 4 << 20;
        // Best effort: a smaller buffer only means more, smaller reads.
        setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, &rcvbuf);
        // Error acks then carry only the header, not a copy of each failed request.
        let one: libc::c_int = 1;
        setsockopt(raw, SOL_NETLINK, NETLINK_CAP_ACK, &one);
        let tv = libc::timeval {
            tv_sec: RECV_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        check(
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv),
            "setsockopt(SO_RCVTIMEO)",
        )?;
        Ok(Self {
            fd,
            buf: vec![0; RECV_BUF],
            enc: Encoder::default(),
            seq: 0,
        })
    }

    fn send_encoded(&mut self) -> io::Result<()> {
        // SAFETY: zeroed sockaddr_nl addresses the kernel (pid 0).
        let mut kernel: libc::sockaddr_nl = unsafe { mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        loop {
            // SAFETY: buffer and address are valid for the lengths passed.
            let n = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    self.enc.buf.as_ptr().cast(),
                    self.enc.buf.len(),
                    0,
                    (&kernel as *const libc::sockaddr_nl).cast(),
                    mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(io::Error::new(e.kind(), format!("netlink send: {e}")));
            }
        }
    }

    /// One datagram into the reusable buffer; a signal interrupting the syscall is retried,
    /// it loses nothing.
    fn recv(&mut self) -> io::Result<usize> {
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_TRUNC,
                )
            };
            if n >= 0 {
                let n = n as usize;
                if n > self.buf.len() {
                    return Err(io::Error::other(format!(
                        "netlink datagram of {n} bytes exceeds the {} byte buffer",
                        self.buf.len()
                    )));
                }
                return Ok(n);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(io::Error::new(e.kind(), format!("netlink recv: {e}")));
            }
        }
    }

    fn next_seq(&mut self, n: usize) -> u32 {
        let base = self.seq.wrapping_add(1);
        self.seq = self.seq.wrapping_add(n as u32 + 1);
        base
    }

    /// Streams one family's table, calling `visit` per entry while reading. With
    /// `only_proto`, the kernel filters on the original L4 protocol (callers still check it:
    /// the fallback dump is unfiltered). Returns the number of entries visited.
    pub fn dump(
        &mut self,
        family: Family,
        only_proto: Option<u8>,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError> {
        self.request_dump(only_proto.is_some(), visit, |enc, seq| {
            enc.dump(seq, family, only_proto)
        })
    }

    /// Streams the `family` entries of `proto` that `select` picks, filtered by the kernel (see
    /// [`Encoder::dump_select`]). A kernel that rejects the filter reports
    /// [`DumpError::FilterRejected`].
    pub fn dump_select(
        &mut self,
        family: Family,
        proto: u8,
        select: Select,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError> {
        self.request_dump(true, visit, |enc, seq| {
            enc.dump_select(seq, family, proto, select)
        })
    }

    /// Sends the one dump request `encode` writes and reads its replies.
    fn request_dump(
        &mut self,
        filtered: bool,
        visit: &mut dyn FnMut(&Entry),
        encode: impl FnOnce(&mut Encoder, u32),
    ) -> Result<usize, DumpError> {
        let seq = self.next_seq(1);
        self.enc.clear();
        encode(&mut self.enc, seq);
        self.send_encoded().map_err(DumpError::Io)?;
        self.read_dump(seq, filtered, visit)
    }

    /// Reads the replies to dump request `seq` up to its end.
    fn read_dump(
        &mut self,
        seq: u32,
        filtered: bool,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError> {
        let mut seen = 0usize;
        let mut interrupted = false;
        // A malformed message is remembered, the rest of the dump drained so the socket
        // stays usable, then the error returned.
        let mut parse_error = None;
        loop {
            let n = self.recv().map_err(DumpError::Io)?;
            let buf = &self.buf[..n];
            for m in msg::messages(buf) {
                let m: Message<'_> = match m {
                    Ok(m) => m,
                    Err(e) => {
                        parse_error.get_or_insert(e);
                        break;
                    }
                };
                if m.seq != seq {
                    continue; // late acknowledgement of an earlier request
                }
                if m.flags & msg::NLM_F_DUMP_INTR != 0 {
                    interrupted = true;
                }
                match m.ty {
                    msg::CT_NEW_TYPE => match msg::parse_entry(m.payload) {
                        Ok(e) if parse_error.is_none() => {
                            seen += 1;
                            visit(&e);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            parse_error.get_or_insert(e);
                        }
                    },
                    msg::NLMSG_DONE | msg::NLMSG_ERROR => {
                        let errno = msg::error_code(m.payload)?;
                        if errno == libc::EINTR {
                            return Err(DumpError::Interrupted);
                        }
                        if errno != 0 {
                            let err = io::Error::from_raw_os_error(errno);
                            if filtered
                                && m.ty == msg::NLMSG_ERROR
                                && (errno == libc::EINVAL || errno == libc::EOPNOTSUPP)
                            {
                                return Err(DumpError::FilterRejected(err));
                            }
                            return Err(DumpError::Kernel(err));
                        }
                        if let Some(e) = parse_error {
                            return Err(DumpError::Parse(e));
                        }
                        if interrupted {
                            return Err(DumpError::Interrupted);
                        }
                        return Ok(seen);
                    }
                    msg::NLMSG_OVERRUN => interrupted = true,
                    _ => {}
                }
            }
        }
    }

    /// Deletes each entry by original tuple (+ ID and zone), in batches.
    pub fn delete(&mut self, entries: &[Entry]) -> io::Result<BatchReport> {
        self.delete_each(entries.len(), |i| &entries[i])
    }

    /// Deletes the `n` entries `entry` names by index, as [`Conntrack::delete`] (callers that
    /// hold their entries beside other data need not copy them out first).
    pub fn delete_each<'a>(
        &mut self,
        n: usize,
        entry: impl Fn(usize) -> &'a Entry,
    ) -> io::Result<BatchReport> {
        self.batch(n, BATCH, Acks::Each, |enc, seq, i| {
            enc.delete(seq, entry(i))
        })
    }

    /// Creates entries (tests, benchmark), in batches of [`CREATE_BATCH`]: the kernel
    /// acknowledges only the last request of each batch and those that failed, so a large
    /// table fills without one read per entry.
    #[cfg(any(test, feature = "testing"))]
    pub fn create(
        &mut self,
        entries: &[Entry],
        timeout_secs: u32,
        status: u32,
    ) -> io::Result<BatchReport> {
        self.batch(
            entries.len(),
            CREATE_BATCH,
            Acks::Failures,
            |enc, seq, i| enc.create(seq, &entries[i], timeout_secs, status),
        )
    }

    fn batch(
        &mut self,
        n: usize,
        per_send: usize,
        acks: Acks,
        encode: impl Fn(&mut Encoder, u32, usize),
    ) -> io::Result<BatchReport> {
        let mut report = BatchReport::default();
        for start in (0..n).step_by(per_send) {
            let end = (start + per_send).min(n);
            let base = self.next_seq(end - start);
            self.enc.clear();
            for i in start..end {
                let at = self.enc.buf.len();
                encode(&mut self.enc, base.wrapping_add((i - start) as u32), i);
                if acks == Acks::Failures && i + 1 < end {
                    // Without NLM_F_ACK the kernel answers only a request that failed; the
                    // last one's acknowledgement then says every earlier one was processed.
                    let flags = u16::from_ne_bytes([self.enc.buf[at + 6], self.enc.buf[at + 7]])
                        & !msg::NLM_F_ACK;
                    self.enc.buf[at + 6..at + 8].copy_from_slice(&flags.to_ne_bytes());
                }
            }
            self.send_encoded()?;
            let (count, last) = (end - start, end - start - 1);
            let (mut answered, mut errors, mut done) = (0, 0, false);
            while !done {
                let len = self.recv()?;
                for m in msg::messages(&self.buf[..len]) {
                    let m = m.map_err(io::Error::other)?;
                    let off = m.seq.wrapping_sub(base) as usize;
                    if m.ty != msg::NLMSG_ERROR || off > last {
                        continue;
                    }
                    answered += 1;
                    match msg::error_code(m.payload).map_err(io::Error::other)? {
                        // With acknowledgements for failures only, successes are counted below.
                        0 if acks == Acks::Each => report.ok += 1,
                        0 => {}
                        libc::ENOENT => {
                            report.not_found += 1;
                            errors += 1;
                        }
                        errno => {
                            report.failed.push((start + off, errno));
                            errors += 1;
                        }
                    }
                    done |= match acks {
                        Acks::Each => answered >= count,
                        Acks::Failures => off == last,
                    };
                }
            }
            if acks == Acks::Failures {
                report.ok += count - errors;
            }
        }
        Ok(report)
    }
}

/// The addresses of every interface in the calling thread's network namespace (getifaddrs,
/// which asks the kernel over an rtnetlink socket opened in that namespace).
pub fn host_addresses() -> io::Result<std::collections::HashSet<std::net::IpAddr>> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    check(unsafe { libc::getifaddrs(&mut head) }, "getifaddrs")?;
    let mut out = std::collections::HashSet::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family tells its real type.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: family AF_INET: a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6: a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        out.insert(ip);
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    // The dump reader against scripted datagrams (a socketpair stands in for the kernel), for the
    // cases a real kernel will not produce on demand.

    use std::net::IpAddr;

    use super::*;
    use crate::conntrack::netlink::msg::{IPPROTO_UDP, Tuple};

    fn entry(port: u16) -> Entry {
        let c: IpAddr = "10.0.0.1".parse().unwrap();
        let f: IpAddr = "10.96.0.10".parse().unwrap();
        Entry {
            orig: Tuple {
                src: c,
                dst: f,
                proto: IPPROTO_UDP,
                src_port: port,
                dst_port: 53,
            },
            reply: Tuple {
                src: f,
                dst: c,
                proto: IPPROTO_UDP,
                src_port: 53,
                dst_port: port,
            },
            id: None,
            zone: 0,
        }
    }

    /// An entry as the kernel sends it in a dump: type CT_NEW, NLM_F_MULTI (+ extra flags).
    fn entry_msg(seq: u32, extra_flags: u16, e: &Entry) -> Vec<u8> {
        let mut enc = Encoder::default();
        enc.create(seq, e, 1, 0);
        let mut b = enc.buf;
        b[6..8].copy_from_slice(&(msg::NLM_F_MULTI | extra_flags).to_ne_bytes());
        b
    }

    fn control_msg(ty: u16, seq: u32, flags: u16, errno: i32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&20u32.to_ne_bytes());
        b.extend_from_slice(&ty.to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&(-errno).to_ne_bytes());
        b
    }

    fn done(seq: u32) -> Vec<u8> {
        control_msg(msg::NLMSG_DONE, seq, msg::NLM_F_MULTI, 0)
    }

    /// A reader over one end of a socketpair; `datagrams` are queued on the other end.
    fn reader(datagrams: &[Vec<u8>]) -> (Conntrack, OwnedFd) {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: fds has room for the two descriptors.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: both fds are fresh and owned here.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        for d in datagrams {
            // SAFETY: d is valid for its length.
            let n = unsafe { libc::send(theirs.as_raw_fd(), d.as_ptr().cast(), d.len(), 0) };
            assert_eq!(n as usize, d.len());
        }
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        setsockopt(ours.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv);
        let ct = Conntrack {
            fd: ours,
            buf: vec![0; RECV_BUF],
            enc: Encoder::default(),
            seq: 0,
        };
        (ct, theirs)
    }

    fn read(datagrams: &[Vec<u8>], filtered: bool) -> (Result<usize, DumpError>, Vec<u16>) {
        let (mut ct, _other) = reader(datagrams);
        let mut ports = vec![];
        let r = ct.read_dump(7, filtered, &mut |e| ports.push(e.orig.src_port));
        (r, ports)
    }

    fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn entries_across_datagrams_until_done() {
        let (r, ports) = read(
            &[
                cat(&[entry_msg(7, 0, &entry(1)), entry_msg(7, 0, &entry(2))]),
                cat(&[entry_msg(7, 0, &entry(3)), done(7)]),
            ],
            true,
        );
        assert_eq!(r.unwrap(), 3);
        assert_eq!(ports, vec![1, 2, 3]);
    }

    #[test]
    fn replies_to_other_requests_are_ignored() {
        let (r, ports) = read(
            &[
                control_msg(msg::NLMSG_ERROR, 3, 0, 0), // a late ack
                cat(&[
                    entry_msg(6, 0, &entry(9)),
                    entry_msg(7, 0, &entry(1)),
                    done(7),
                ]),
            ],
            true,
        );
        assert_eq!(r.unwrap(), 1);
        assert_eq!(ports, vec![1]);
    }

    #[test]
    fn dump_intr_drains_then_reports_interrupted() {
        let (r, ports) = read(
            &[
                entry_msg(7, msg::NLM_F_DUMP_INTR, &entry(1)),
                cat(&[entry_msg(7, 0, &entry(2)), done(7)]),
            ],
            true,
        );
        assert!(matches!(r, Err(DumpError::Interrupted)), "{r:?}");
        assert_eq!(ports, vec![1, 2], "the partial result was still visited");
    }

    #[test]
    fn eintr_is_interrupted() {
        let (r, _) = read(&[control_msg(msg::NLMSG_ERROR, 7, 0, libc::EINTR)], true);
        assert!(matches!(r, Err(DumpError::Interrupted)), "{r:?}");
        let (r, _) = read(
            &[control_msg(
                msg::NLMSG_DONE,
                7,
                msg::NLM_F_MULTI,
                libc::EINTR,
            )],
            true,
        );
        assert!(matches!(r, Err(DumpError::Interrupted)), "{r:?}");
    }

    #[test]
    fn filter_rejection_only_for_a_filtered_dump() {
        for errno in [libc::EINVAL, libc::EOPNOTSUPP] {
            let (r, _) = read(&[control_msg(msg::NLMSG_ERROR, 7, 0, errno)], true);
            assert!(matches!(r, Err(DumpError::FilterRejected(_))), "{r:?}");
            let (r, _) = read(&[control_msg(msg::NLMSG_ERROR, 7, 0, errno)], false);
            assert!(matches!(r, Err(DumpError::Kernel(_))), "{r:?}");
        }
        let (r, _) = read(&[control_msg(msg::NLMSG_ERROR, 7, 0, libc::EPERM)], true);
        assert!(matches!(r, Err(DumpError::Kernel(_))), "{r:?}");
    }

    #[test]
    fn malformed_entry_drains_and_fails_without_visiting_later_entries() {
        let mut bad = entry_msg(7, 0, &entry(2));
        // Break the first attribute's length so the entry cannot be parsed.
        bad[20] = 0xff;
        bad[21] = 0x00;
        let (r, ports) = read(
            &[
                cat(&[entry_msg(7, 0, &entry(1)), bad]),
                cat(&[entry_msg(7, 0, &entry(3)), done(7)]),
            ],
            true,
        );
        assert!(matches!(r, Err(DumpError::Parse(_))), "{r:?}");
        assert_eq!(ports, vec![1]);
    }

    #[test]
    fn a_stalled_kernel_is_an_io_error_not_a_hang() {
        let (r, ports) = read(&[entry_msg(7, 0, &entry(1))], true);
        assert!(matches!(r, Err(DumpError::Io(_))), "{r:?}");
        assert_eq!(ports, vec![1]);
    }
}
