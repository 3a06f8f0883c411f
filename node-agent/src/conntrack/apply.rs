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

/// Deletes stale entries, each by tuple + ID (an entry replaced since under the same tuple
/// has another ID: its delete fails harmlessly, as not found).
pub trait Delete {
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport>;
}

/// What a pass needs from the conntrack table.
pub trait Table: Delete {
    /// Streams the entries `what` asks for to `visit`; returns how many. `visit` is handed
    /// what deletes while the dump streams (the kernel's: a second socket, the dump's own is
    /// busy until its end), so a pass deletes in bounded batches and never holds the table or
    /// its stale list.
    fn dump(
        &mut self,
        what: Dump,
        visit: &mut dyn FnMut(&Entry, &mut dyn Delete),
    ) -> Result<usize, DumpError>;
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

/// The table of the calling thread's network namespace. Its sockets are opened when a pass
/// first reads or deletes (a family with nothing to judge never needs them, nor
/// CAP_NET_ADMIN), and each is dropped after it failed: it may hold the rest of a broken
/// reply, the next use starts clean. Deletes go over their own socket, also while a dump
/// streams over the other (as `conntrack -D` does).
#[derive(Default)]
pub struct Kernel {
    socket: Option<Conntrack>,
    deletes: Deletes,
}

/// The socket a [`Kernel`] deletes on.
#[derive(Default)]
struct Deletes {
    socket: Option<Conntrack>,
}

impl Delete for Deletes {
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        for (e, why) in stale {
            tracing::debug!(ip_family = %e.orig.family(), entry = %e, reason = ?why, "deleting stale conntrack entry");
        }
        if self.socket.is_none() {
            self.socket = Some(Conntrack::open()?);
        }
        let socket = self.socket.as_mut().expect("opened above");
        let r = socket.delete_each(stale.len(), |i| &stale[i].0);
        if r.is_err() {
            self.socket = None;
        }
        r
    }
}

impl Delete for Kernel {
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        self.deletes.delete(stale)
    }
}

impl Table for Kernel {
    fn dump(
        &mut self,
        what: Dump,
        visit: &mut dyn FnMut(&Entry, &mut dyn Delete),
    ) -> Result<usize, DumpError> {
        if self.socket.is_none() {
            self.socket = Some(Conntrack::open().map_err(DumpError::Open)?);
        }
        let socket = self.socket.as_mut().expect("opened above");
        let deletes = &mut self.deletes;
        let visit = &mut |e: &Entry| visit(e, deletes);
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

    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        socket::host_addresses()
    }
}

/// `T` read as usual; its deletes only logged, never made (the pass is never handed `T`'s
/// own deletes, during a dump or after).
pub struct DryRun<T>(pub T);

/// The deletes of a dry run: logged only.
struct WouldDelete;

impl Delete for WouldDelete {
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        for (e, why) in stale {
            tracing::info!(ip_family = %e.orig.family(), entry = %e, reason = ?why, "dry-run: would delete stale conntrack entry");
        }
        Ok(BatchReport::default())
    }
}

impl<T> Delete for DryRun<T> {
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        WouldDelete.delete(stale)
    }
}

impl<T: Table> Table for DryRun<T> {
    fn dump(
        &mut self,
        what: Dump,
        visit: &mut dyn FnMut(&Entry, &mut dyn Delete),
    ) -> Result<usize, DumpError> {
        self.0.dump(what, &mut |e, _| visit(e, &mut WouldDelete))
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
