//! One cleanup pass over one IP family: stream the table (UDP only when the kernel lets us),
//! decide per entry, then delete the stale entries by tuple + ID. Works against the `Table`
//! trait so the retry and abort rules are tested without a kernel.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::clean::{FamilyModel, Stale, stale};
use super::msg::{AF_INET, Entry, IPPROTO_UDP};
use super::socket::{BatchReport, Conntrack, DumpError};

/// upstream `MaxAttemptsEINTR`.
pub const MAX_DUMP_ATTEMPTS: usize = 5;

/// What a pass needs from the conntrack table.
pub trait Table {
    fn dump(
        &mut self,
        family: u8,
        only_proto: Option<u8>,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError>;
    fn delete(&mut self, entries: &[Entry]) -> io::Result<BatchReport>;
    /// The addresses the host (this table's network namespace) owns now, for the NodePort
    /// rule. None known: the rule judges only DNATed flows to the Node object's addresses.
    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        Ok(HashSet::new())
    }
}

impl Table for Conntrack {
    fn dump(
        &mut self,
        family: u8,
        only_proto: Option<u8>,
        visit: &mut dyn FnMut(&Entry),
    ) -> Result<usize, DumpError> {
        Conntrack::dump(self, family, only_proto, visit)
    }

    fn delete(&mut self, entries: &[Entry]) -> io::Result<BatchReport> {
        Conntrack::delete(self, entries)
    }

    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        super::socket::host_addresses()
    }
}

/// How long an IP inside a ServiceCIDR must look unallocated (no IPAddress object in the
/// watched list) before flows DNATed to it are deleted. The IPAddress exists before its
/// Service, so kube-proxy cannot DNAT to an IP before the apiserver holds its IPAddress; only
/// the lag of our own IPAddress watch can make a new service's IP look orphaned, and that lag
/// must stay below this.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(60);

/// Carried from pass to pass: whether the kernel accepts the protocol filter, and since when
/// each ServiceCIDR IP with DNATed flows has looked orphaned.
#[derive(Debug, Clone)]
pub struct PassState {
    pub kernel_filter: bool,
    pub orphan_grace: Duration,
    /// IP -> first pass that saw DNATed flows to it while no IPAddress held it. Forgotten as
    /// soon as a pass no longer sees it orphaned.
    pub orphans: HashMap<IpAddr, Instant>,
}

impl Default for PassState {
    fn default() -> Self {
        Self {
            kernel_filter: true,
            orphan_grace: ORPHAN_GRACE,
            orphans: HashMap::new(),
        }
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// Entries read from the table in the last dump attempt.
    pub scanned: usize,
    pub stale: usize,
    pub deleted: usize,
    /// Stale entries gone (or replaced under the same tuple) before the delete reached them.
    pub already_gone: usize,
    pub failed_deletes: usize,
    /// Every dump attempt was interrupted; the last partial result was used.
    pub partial: bool,
    pub dump_attempts: usize,
    /// The model was empty: nothing could be stale, the table was not read.
    pub skipped: bool,
    /// Flows to orphaned ServiceCIDR IPs kept this time: the IP has not looked orphaned for
    /// the grace period yet.
    pub orphans_pending: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The pass stopped before deleting anything.
    #[error("listing conntrack entries: {0}")]
    Dump(DumpError),
    /// Some deletes may have been made (counted in the report).
    #[error("deleting conntrack entries: {source}")]
    Delete {
        report: PassReport,
        source: io::Error,
    },
}

/// Runs one pass. `dry_run` decides and reports but deletes nothing. `on_stale` sees each
/// stale entry and why (for logs).
pub fn run_pass(
    table: &mut dyn Table,
    family: u8,
    model: &FamilyModel,
    state: &mut PassState,
    dry_run: bool,
    on_stale: &mut dyn FnMut(&Entry, Stale),
) -> Result<PassReport, PassError> {
    let mut report = PassReport::default();
    if model.is_empty() {
        report.skipped = true;
        return Ok(report);
    }
    let host_ips = match table.host_addresses() {
        Ok(a) => a.into_iter().map(super::clean::canonical).collect(),
        Err(e) => {
            // Fewer known addresses only means fewer NodePort flows judged.
            tracing::warn!(error = %e, "cannot read the host's addresses; the NodePort rule judges only DNATed flows to the Node's addresses");
            HashSet::new()
        }
    };
    let now = Instant::now();
    // Only the stale entries are kept, never the table.
    let mut marked: Vec<(Entry, Stale)> = Vec::new();
    loop {
        report.dump_attempts += 1;
        marked.clear();
        let mut visited = 0usize;
        let mut visit = |e: &Entry| {
            visited += 1;
            if let Some(why) = stale(e, model, &host_ips) {
                marked.push((*e, why));
            }
        };
        let filter = state.kernel_filter.then_some(IPPROTO_UDP);
        let res = table.dump(family, filter, &mut visit);
        report.scanned = visited;
        match res {
            Ok(_) => break,
            Err(DumpError::FilterRejected(e)) => {
                tracing::warn!(
                    family = family_name(family), error = %e,
                    "kernel rejects the conntrack dump filter on the L4 protocol; dumping everything and filtering here"
                );
                state.kernel_filter = false;
                report.dump_attempts -= 1;
            }
            Err(DumpError::Interrupted) if report.dump_attempts < MAX_DUMP_ATTEMPTS => {}
            Err(DumpError::Interrupted) => {
                tracing::info!(
                    family = family_name(family),
                    attempts = report.dump_attempts,
                    "conntrack dump interrupted every time; continuing to clean with the partial result"
                );
                report.partial = true;
                break;
            }
            Err(e) => return Err(PassError::Dump(e)),
        }
    }
    apply_orphan_grace(&mut marked, state, now, &mut report);
    report.stale = marked.len();
    for (e, why) in &marked {
        on_stale(e, *why);
    }
    if dry_run || marked.is_empty() {
        return Ok(report);
    }
    let entries: Vec<Entry> = marked.into_iter().map(|(e, _)| e).collect();
    match table.delete(&entries) {
        Ok(b) => {
            report.deleted = b.ok;
            report.already_gone = b.not_found;
            report.failed_deletes = b.failed.len();
            for (i, errno) in b.failed.iter().take(5) {
                tracing::warn!(
                    entry = %entries[*i], error = %io::Error::from_raw_os_error(*errno),
                    "deleting a stale conntrack entry failed"
                );
            }
            Ok(report)
        }
        Err(source) => Err(PassError::Delete { report, source }),
    }
}

/// Keeps the flows to IPs that have not looked orphaned for the grace period yet (they are
/// judged again by a later pass), and remembers since when each IP has.
fn apply_orphan_grace(
    marked: &mut Vec<(Entry, Stale)>,
    state: &mut PassState,
    now: Instant,
    report: &mut PassReport,
) {
    let seen: HashSet<IpAddr> = marked
        .iter()
        .filter(|(_, why)| *why == Stale::OrphanedServiceIp)
        .map(|(e, _)| super::clean::canonical(e.orig.dst))
        .collect();
    state.orphans.retain(|ip, _| seen.contains(ip));
    for ip in &seen {
        state.orphans.entry(*ip).or_insert(now);
    }
    let grace = state.orphan_grace;
    let orphans = &state.orphans;
    let before = marked.len();
    marked.retain(|(e, why)| {
        *why != Stale::OrphanedServiceIp
            || orphans
                .get(&super::clean::canonical(e.orig.dst))
                .is_some_and(|since| now.saturating_duration_since(*since) >= grace)
    });
    report.orphans_pending = before - marked.len();
}

pub fn family_name(family: u8) -> &'static str {
    if family == AF_INET { "IPv4" } else { "IPv6" }
}

#[cfg(test)]
#[path = "pass_tests.rs"]
mod tests;
