//! The dump reader against scripted datagrams (a socketpair stands in for the kernel), for the
//! cases a real kernel will not produce on demand.

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
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
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
