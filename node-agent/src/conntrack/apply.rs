//! The conntrack table a pass reads and deletes from, behind the [`Table`] trait (tests use a
//! recording fake), and the one place dry-run is decided: [`DryRun`] reads as usual and only
//! logs the deletes.

use std::collections::HashSet;
use std::io;
use std::net::IpAddr;

use super::decide::Stale;
use super::netlink::family::Family;
use super::netlink::filter::Select;
use super::netlink::msg::Entry;
use super::netlink::socket::{self, BatchReport, Conntrack, DumpError};

/// What one dump asks the table for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dump {
    /// One family's entries; with a protocol, the kernel returns only those (a caller still
    /// checks: a table that cannot filter returns everything).
    Whole(Family, Option<u8>),
    /// The entries of a family and protocol that a selection picks (a triggered pass), the
    /// kernel filtering them.
    Select(Family, u8, Select),
}

/// What a pass needs from the conntrack table.
pub trait Table {
    /// Streams the entries `what` asks for to `visit`; returns how many.
    fn dump(&mut self, what: Dump, visit: &mut dyn FnMut(&Entry)) -> Result<usize, DumpError>;
    /// Deletes the stale entries, each by tuple + ID.
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport>;
    /// The addresses the host (this table's network namespace) owns now, for the NodePort
    /// rule. None known: the rule judges only DNATed flows to the Node object's addresses.
    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        Ok(HashSet::new())
    }
    /// Whether the deletes are only logged (for the summary line; decided by [`table`]).
    fn dry_run(&self) -> bool {
        false
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
}

impl Table for Kernel {
    fn dump(&mut self, what: Dump, visit: &mut dyn FnMut(&Entry)) -> Result<usize, DumpError> {
        let socket = self.socket()?;
        let r = match what {
            Dump::Whole(family, only_proto) => socket.dump(family, only_proto, visit),
            Dump::Select(family, proto, select) => socket.dump_select(family, proto, select, visit),
        };
        // An interrupted dump was read to its end and a rejected filter answered at once:
        // the socket is clean after both.
        if let Err(DumpError::Kernel(_) | DumpError::Io(_) | DumpError::Parse(_)) = &r {
            self.socket = None;
        }
        r
    }

    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        for (e, why) in stale {
            tracing::debug!(ip_family = %e.orig.family(), entry = %e, reason = ?why, "deleting stale conntrack entry");
        }
        let entries: Vec<Entry> = stale.iter().map(|(e, _)| *e).collect();
        let Some(socket) = self.socket.as_mut() else {
            // Deletes follow the dump that found them, on its socket.
            return Err(io::Error::other("no conntrack socket to delete on"));
        };
        let r = socket.delete(&entries);
        if r.is_err() {
            self.socket = None;
        }
        r
    }

    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        socket::host_addresses()
    }
}

/// `T` read as usual; its deletes only logged, never made.
pub struct DryRun<T>(pub T);

impl<T: Table> Table for DryRun<T> {
    fn dump(&mut self, what: Dump, visit: &mut dyn FnMut(&Entry)) -> Result<usize, DumpError> {
        self.0.dump(what, visit)
    }

    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        for (e, why) in stale {
            tracing::info!(ip_family = %e.orig.family(), entry = %e, reason = ?why, "dry-run: would delete stale conntrack entry");
        }
        Ok(BatchReport::default())
    }

    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        self.0.host_addresses()
    }

    fn dry_run(&self) -> bool {
        true
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
