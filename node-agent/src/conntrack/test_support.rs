//! What conntrack's tests share (built only for them): addresses and flows written as text, a
//! table that answers dumps and deletes as the kernel does, watch events decoded as the agent's
//! watches decode them, and the durations of simulated clocks.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kube::runtime::watcher::Event;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::apply::{Delete, Dump, Table};
use super::decide::Stale;
use super::model::reference::slim;
use super::netlink::msg::Entry;
use super::netlink::socket::{BatchReport, DumpError};

pub(crate) fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// kube-proxy's DNAT shape: orig client -> frontend, reply backend -> client (no ID).
pub(crate) fn dnat(proto: u8, client: &str, frontend: &str, backend: &str) -> Entry {
    Entry::dnat(proto, sa(client), sa(frontend), sa(backend))
}

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(crate) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A watch event of whole objects as the agent's watch decodes it (`wire.rs`).
pub(crate) fn slim_event<F: Serialize, W: DeserializeOwned>(ev: Event<F>) -> Event<W> {
    match ev {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(o) => Event::InitApply(slim(&o)),
        Event::Apply(o) => Event::Apply(slim(&o)),
        Event::Delete(o) => Event::Delete(slim(&o)),
    }
}

/// Whether the kernel returns `e` for the dump `what` (its family, protocol and selection).
pub(crate) fn dumps(what: Dump, e: &Entry) -> bool {
    match what {
        Dump::Whole(fam, proto) => {
            e.orig.family() == fam && proto.is_none_or(|p| p == e.orig.proto)
        }
        Dump::Select(fam, proto, sel) => {
            e.orig.family() == fam && e.orig.proto == proto && sel.matches(e)
        }
    }
}

/// Deletes `stale` from a fake table as the kernel would: each one gone, or not found.
pub(crate) fn remove_entries(entries: &mut Vec<Entry>, stale: &[(Entry, Stale)]) -> BatchReport {
    let mut report = BatchReport::default();
    for (e, _) in stale {
        let before = entries.len();
        entries.retain(|x| x != e);
        if entries.len() < before {
            report.ok += 1;
        } else {
            report.not_found += 1;
        }
    }
    report
}

/// A table that does what the kernel does with each dump and delete (filters honoured).
#[derive(Debug, Default)]
pub(crate) struct KernelLike {
    pub(crate) entries: Vec<Entry>,
    pub(crate) host: HashSet<IpAddr>,
    /// The kernel rejects the filters of a triggered pass.
    pub(crate) reject_select: bool,
}

impl Table for KernelLike {
    fn dump(
        &mut self,
        what: Dump,
        visit: &mut dyn FnMut(&Entry, &mut dyn Delete),
    ) -> Result<usize, DumpError> {
        if self.reject_select && matches!(what, Dump::Select(..)) {
            return Err(DumpError::FilterRejected(io::Error::from_raw_os_error(
                libc::EINVAL,
            )));
        }
        // Read first: deletes while the dump streams change the table, not what it returns.
        let read: Vec<Entry> = self
            .entries
            .iter()
            .filter(|e| dumps(what, e))
            .copied()
            .collect();
        for e in &read {
            visit(e, self);
        }
        Ok(read.len())
    }

    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        Ok(self.host.clone())
    }
}

impl Delete for KernelLike {
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        Ok(remove_entries(&mut self.entries, stale))
    }
}
