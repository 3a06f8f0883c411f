//! What one pass reports: its counts, and the one summary line every pass that read the table
//! logs.

use std::time::Duration;

use crate::conntrack::netlink::family::Family;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
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
    /// Nothing to judge (an empty model, or a focus with no source): the table was not read.
    pub skipped: bool,
    /// Flows to orphaned ServiceCIDR IPs kept this time: the IP has not looked orphaned for
    /// the grace period yet.
    pub orphans_pending: usize,
    /// Flows to backends never seen serving their key that a full pass kept this time: the
    /// backend has not looked unseen for the grace period yet.
    pub unseen_pending: u32,
    /// When the first of those kept for a grace (orphans and unseen backends) finishes it.
    pub orphans_due_in: Option<Duration>,
}

/// What the summary line of a pass says beside its report.
#[derive(Debug, Clone, Copy)]
pub struct PassContext {
    pub family: Family,
    /// A triggered pass: how many frontends, nodePorts and removed backends it looked at.
    pub scope: Option<(usize, usize, usize)>,
    pub dry_run: bool,
    pub kernel_filter: bool,
    pub elapsed: Duration,
}

impl PassReport {
    /// The one line every pass that read the table logs.
    pub fn log(&self, cx: &PassContext) {
        let PassReport {
            scanned,
            stale,
            deleted,
            already_gone,
            failed_deletes,
            partial,
            orphans_pending,
            unseen_pending,
            ..
        } = *self;
        let PassContext {
            family,
            scope,
            dry_run,
            kernel_filter,
            elapsed,
        } = *cx;
        let triggered = scope.is_some();
        let (scope_frontends, scope_node_ports, scope_backends) = scope.unwrap_or_default();
        tracing::info!(
            ip_family = family.label(),
            scanned,
            stale,
            deleted,
            already_gone,
            failed = failed_deletes,
            partial,
            orphans_pending,
            unseen_pending,
            triggered,
            scope_frontends,
            scope_node_ports,
            scope_backends,
            dry_run,
            kernel_filter,
            elapsed_ms = elapsed.as_millis() as u64,
            "conntrack cleanup pass"
        );
    }
}
