//! The conntrack table a pass reads and deletes from, behind the [`Table`] trait (tests use a
//! recording fake), and the one place dry-run is decided: [`DryRun`] reads as usual and only
//! logs the deletes.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr};

use super::decide::Stale;
use super::family::Family;
use super::model::canonical;
use super::msg::Entry;
use super::socket::{self, BatchReport, Conntrack, DumpError};

/// What a pass needs from the conntrack table.
pub trait Table {
    fn dump(
        &mut self,
        family: Family,
        only_proto: Option<u8>,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError>;
    /// Deletes the stale entries, each by tuple + ID.
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport>;
    /// The IPv4 entries of `proto` whose reply source is `src`. By default one dump of `proto`
    /// filtered here; the kernel filters for the real table.
    fn dump_reply_src(
        &mut self,
        proto: u8,
        src: Ipv4Addr,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError> {
        let want = IpAddr::V4(src);
        let mut n = 0;
        self.dump(Family::V4, Some(proto), &mut |e| {
            if e.orig.proto == proto && canonical(e.reply.src) == want {
                n += 1;
                visit(e);
            }
        })?;
        Ok(n)
    }
    /// The addresses the host (this table's network namespace) owns now, for the NodePort
    /// rule. None known: the rule judges only DNATed flows to the Node object's addresses.
    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        Ok(HashSet::new())
    }
}

/// The table of the calling thread's network namespace. The socket is opened when a pass first
/// reads (a family with nothing to judge never needs it, nor CAP_NET_ADMIN), and dropped after
/// a failed dump or delete: it may hold the rest of a broken reply, the next pass starts clean.
#[derive(Default)]
pub struct Kernel {
    socket: Option<Conntrack>,
}

impl Kernel {
    fn socket(&mut self) -> Result<&mut Conntrack, DumpError> {
        if self.socket.is_none() {
            self.socket = Some(Conntrack::open().map_err(DumpError::Open)?);
        }
        Ok(self.socket.as_mut().expect("opened above"))
    }

    fn keep_if_clean<T>(&mut self, r: Result<T, DumpError>) -> Result<T, DumpError> {
        // An interrupted dump was read to its end and a rejected filter answered at once:
        // the socket is clean after both.
        if let Err(DumpError::Kernel(_) | DumpError::Io(_) | DumpError::Parse(_)) = &r {
            self.socket = None;
        }
        r
    }
}

impl Table for Kernel {
    fn dump(
        &mut self,
        family: Family,
        only_proto: Option<u8>,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError> {
        let r = self.socket()?.dump(family, only_proto, visit);
        self.keep_if_clean(r)
    }

    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        for (e, why) in stale {
            tracing::debug!(ip_family = %e.orig.family(), entry = %e, reason = ?why, "deleting stale conntrack entry");
        }
        let entries: Vec<Entry> = stale.iter().map(|(e, _)| *e).collect();
        let socket = self.socket().map_err(|e| match e {
            DumpError::Open(e) => e,
            other => io::Error::other(other.to_string()),
        })?;
        let r = socket.delete(&entries);
        if r.is_err() {
            self.socket = None;
        }
        r
    }

    fn dump_reply_src(
        &mut self,
        proto: u8,
        src: Ipv4Addr,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError> {
        let r = self.socket()?.dump_reply_src(proto, src, visit);
        self.keep_if_clean(r)
    }

    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        socket::host_addresses()
    }
}

/// `T` read as usual; its deletes only logged, never made.
pub struct DryRun<T>(pub T);

impl<T: Table> Table for DryRun<T> {
    fn dump(
        &mut self,
        family: Family,
        only_proto: Option<u8>,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError> {
        self.0.dump(family, only_proto, visit)
    }

    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        for (e, why) in stale {
            tracing::info!(ip_family = %e.orig.family(), entry = %e, reason = ?why, "dry-run: would delete stale conntrack entry");
        }
        Ok(BatchReport::default())
    }

    fn dump_reply_src(
        &mut self,
        proto: u8,
        src: Ipv4Addr,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError> {
        self.0.dump_reply_src(proto, src, visit)
    }

    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        self.0.host_addresses()
    }
}

/// The table a round cleans, with or without its deletes: decided here only.
pub fn table(dry_run: bool) -> Box<dyn Table + Send> {
    if dry_run {
        Box::new(DryRun(Kernel::default()))
    } else {
        Box::new(Kernel::default())
    }
}
