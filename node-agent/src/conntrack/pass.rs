//! One cleanup pass over one IP family: stream the table (UDP only when the kernel lets us),
//! decide per entry, then delete the stale entries by tuple + ID. Works against the `Table`
//! trait so the retry and abort rules are tested without a kernel.

use std::io;

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
}

/// Carried from pass to pass: whether the kernel accepts the protocol filter.
#[derive(Debug, Clone, Copy)]
pub struct PassState {
    pub kernel_filter: bool,
}

impl Default for PassState {
    fn default() -> Self {
        Self {
            kernel_filter: true,
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
    // Only the stale entries are kept, never the table.
    let mut marked: Vec<(Entry, Stale)> = Vec::new();
    loop {
        report.dump_attempts += 1;
        marked.clear();
        let mut visited = 0usize;
        let mut visit = |e: &Entry| {
            visited += 1;
            if let Some(why) = stale(e, model) {
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

pub fn family_name(family: u8) -> &'static str {
    if family == AF_INET { "IPv4" } else { "IPv6" }
}

#[cfg(test)]
#[path = "pass_tests.rs"]
mod tests;
