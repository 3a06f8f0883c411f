//! One cleanup pass over one IP family: stream the table (UDP only when the kernel lets us),
//! decide per entry, and delete the stale entries by tuple + ID in bounded batches while the
//! dump streams ([`sweep`] says why that is safe). Works against the `Table` trait so
//! the retry and abort rules are tested without a kernel. Beside it, the round that runs each
//! family's pass on the netlink thread (`round`), what a pass reports (`report`) and the Node
//! Event for a filling table (`fill`).

pub mod fill;
pub mod report;
pub mod round;
pub mod sweep;

#[cfg(test)]
mod pass_tests;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::apply::{Dump, Table};
use super::decide::{Flow, Stale, staleness};
use super::model::focus::Scope;
use super::model::removed::Removed;
use super::model::{FamilyModel, canonical};
use super::netlink::family::Family;
use super::netlink::filter::Select;
use super::netlink::msg::{Entry, IPPROTO_UDP};
use super::netlink::socket::DumpError;
pub use report::{PassContext, PassReport};
use sweep::{DELETE_BATCH, Graces, Parts, Sweep};

/// upstream `MaxAttemptsEINTR`.
pub const MAX_DUMP_ATTEMPTS: usize = 5;

/// How long an IP inside a ServiceCIDR must look unallocated (no IPAddress object in the
/// watched list) before flows DNATed to it are deleted. The IPAddress exists before its
/// Service, so kube-proxy cannot DNAT to an IP before the apiserver holds its IPAddress; only
/// the lag of our own IPAddress watch can make a new service's IP look orphaned, and that lag
/// must stay below this. The same grace holds back flows to a backend the agent never saw serve
/// its key ([`Stale::UnseenBackend`]): it bounds our EndpointSlice watch's lag the same way.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(60);

/// Carried from pass to pass: whether the kernel accepts the protocol filter, and the graces'
/// clocks.
#[derive(Debug, Clone)]
pub struct PassState {
    pub kernel_filter: bool,
    /// Whether the kernel accepts the filters of a triggered pass (reply source, original
    /// destination and port).
    pub select_filter: bool,
    pub orphan_grace: Duration,
    /// Since when each orphaned service IP and unseen backend has waited, and the backends
    /// seen removed.
    pub graces: Graces,
    /// Stale entries held at most before they are deleted ([`DELETE_BATCH`]; tests set less).
    pub delete_batch: usize,
}

impl Default for PassState {
    fn default() -> Self {
        Self {
            kernel_filter: true,
            select_filter: true,
            orphan_grace: ORPHAN_GRACE,
            graces: Graces::default(),
            delete_batch: DELETE_BATCH,
        }
    }
}

#[cfg(test)]
impl PassState {
    /// For tests of other rules (streaming, focus, retries): every backend counts as seen
    /// removed, so flows to not-serving backends go at once as before the unseen-backend rule.
    pub fn seen_all() -> Self {
        Self {
            graces: Graces::seen_all(),
            ..Self::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The pass stopped before deleting anything.
    #[error("listing conntrack entries: {0}")]
    Dump(DumpError),
    /// The dump failed after some stale entries it had returned were deleted (counted in the
    /// report: each was stale on its own); what the pass still held was dropped.
    #[error("listing conntrack entries (after {} deleted): {source}", report.deleted)]
    DumpAfterDeletes {
        report: Box<PassReport>,
        source: DumpError,
    },
    /// Some deletes may have been made (counted in the report).
    #[error("deleting conntrack entries: {source}")]
    Delete {
        report: Box<PassReport>,
        source: io::Error,
    },
}

impl PassError {
    /// The `error` label of `groundskeeper_conntrack_pass_failures_total`: a missing
    /// capability (`socket_open`) reads differently from a kernel that refused the dump or the
    /// deletes.
    pub fn metric_label(&self) -> &'static str {
        let dump = match self {
            PassError::Dump(e) | PassError::DumpAfterDeletes { source: e, .. } => e,
            PassError::Delete { .. } => return "delete",
        };
        match dump {
            DumpError::Open(_) => "socket_open",
            DumpError::Interrupted => "interrupted",
            DumpError::FilterRejected(_) => "filter_rejected",
            DumpError::Kernel(_) => "kernel",
            DumpError::Io(_) => "io",
            DumpError::Parse(_) => "parse",
        }
    }
}

/// Runs one pass at `now` over every entry of `family` (tests and the benchmark; a round always
/// goes through [`run_focused_pass`]).
#[cfg(any(test, feature = "testing"))]
pub fn run_pass(
    table: &mut dyn Table,
    family: Family,
    model: &FamilyModel,
    state: &mut PassState,
    now: Instant,
) -> Result<PassReport, PassError> {
    run_focused_pass(table, family, model, state, None, now)
}

/// At most this many kernel-filtered dumps in a triggered pass; a scope that needs more is
/// cheaper as one UDP dump filtered here. The kernel walks the whole table for each filtered
/// dump but copies out only what matches: one UDP dump costs about two filtered dumps
/// (benches/conntrack_pass/; docs/benchmarks.md, at 250,000 entries), so two filtered dumps
/// still cost less than the UDP dump and its judging, three more.
pub const MAX_FOCUSED_DUMPS: usize = 2;

/// The kernel-filtered dumps that return every entry of `family` that `scope` touches (and
/// possibly more: the pass still checks each entry against the scope), or `None` when one UDP
/// dump filtered here is cheaper: more than [`MAX_FOCUSED_DUMPS`] of them, or an IPv6 backend
/// (kernel 6.18 inverts the CTA_FILTER match on IPv6 addresses, so IPv6 selections are by
/// port only). A frontend port with several addresses is one dump on the port: one walk of the
/// table copying a few more entries costs less than a walk per address.
pub fn selections(family: Family, scope: &Scope) -> Option<Vec<Select>> {
    let mut out = BTreeSet::new();
    for port in &scope.node_ports {
        out.insert(Select::OrigDstPort(*port));
    }
    let mut by_port: BTreeMap<u16, BTreeSet<IpAddr>> = BTreeMap::new();
    for f in &scope.frontends {
        by_port
            .entry(f.port())
            .or_default()
            .insert(canonical(f.ip()));
    }
    for (port, ips) in by_port {
        if scope.node_ports.contains(&port) {
            continue;
        }
        let mut ips = ips.into_iter();
        match (family, ips.next(), ips.next()) {
            (Family::V4, Some(IpAddr::V4(ip)), None) => out.insert(Select::OrigDst(ip, port)),
            _ => out.insert(Select::OrigDstPort(port)),
        };
    }
    for b in &scope.backends {
        match (family, canonical(*b)) {
            (Family::V4, IpAddr::V4(ip)) => out.insert(Select::ReplySource(ip)),
            // No IPv4 entry comes from an IPv6 address.
            (Family::V4, IpAddr::V6(_)) => false,
            (Family::V6, _) => return None,
        };
    }
    (out.len() <= MAX_FOCUSED_DUMPS).then(|| out.into_iter().collect())
}

/// A pass that judges only the entries `scope` touches (`None`: every entry). A triggered pass
/// is scoped to what the last model change touched ([`Scope::between`]): the kernel returns only
/// those entries when a few filtered dumps can ask for them ([`selections`]), else one UDP dump
/// is filtered here. It deletes exactly what a full pass would among the entries in scope,
/// except flows to orphaned service IPs and to backends never seen serving, left to full passes
/// (their grace is measured across those; a scoped pass starts an unseen backend's clock). Stale
/// entries are deleted in batches of at most `state.delete_batch` while the dump streams. The
/// graces are measured at `now`, the pass's start (the round passes the clock's; tests their
/// own).
///
/// The I/O is here and in `read_table`; what they decide with is pure: [`staleness_in`],
/// [`selections`], and [`Sweep`]'s per-entry rules.
pub fn run_focused_pass(
    table: &mut dyn Table,
    family: Family,
    model: &FamilyModel,
    state: &mut PassState,
    scope: Option<&Scope>,
    now: Instant,
) -> Result<PassReport, PassError> {
    // The one check for nothing to judge: the table is not even opened.
    if model.is_empty() || scope.is_some_and(Scope::is_empty) {
        return Ok(PassReport {
            skipped: true,
            ..PassReport::default()
        });
    }
    let host_ips = match table.host_addresses() {
        Ok(a) => a.into_iter().map(canonical).collect(),
        Err(e) => {
            // Fewer known addresses only means fewer NodePort flows judged.
            tracing::warn!(error = %e, "cannot read the host's addresses; the NodePort rule judges only DNATed flows to the Node's addresses");
            HashSet::new()
        }
    };
    let (full, grace) = (scope.is_none(), state.orphan_grace);
    // The graces are borrowed, as they were when the pass began, while the dump streams.
    let graces = &state.graces;
    let decide = |e: &Entry| staleness_in(e, model, &host_ips, &graces.removed, scope);
    let (orphans, unseen) = graces.clocks(grace, now, full);
    let mut sweep = Sweep::new(&decide, orphans, unseen, state.delete_batch);
    let filters = (&mut state.kernel_filter, &mut state.select_filter);
    let read = read_table(table, family, filters, scope, &mut sweep);
    let Parts {
        mut report,
        failed,
        sent,
        orphans,
        unseen,
    } = sweep.into_parts();
    if let Err(e) = read {
        return Err(if sent {
            PassError::DumpAfterDeletes {
                report: Box::new(report),
                source: e,
            }
        } else {
            PassError::Dump(e)
        });
    }
    // When a full pass is next due for a grace that runs out (also after a scoped pass, whose
    // unseen backends only a full pass deletes).
    report.orphans_due_in = state.graces.after_pass(orphans, unseen, full, grace, now);
    match failed {
        Some(source) => Err(PassError::Delete {
            report: Box::new(report),
            source,
        }),
        None => Ok(report),
    }
}

/// Why `e` is stale, if it is, for a pass over `scope` (`None`: every entry), with the backends
/// seen removed in `removed`. A scoped pass leaves flows to orphaned service IPs alone (their
/// grace is measured across full passes); flows to backends never seen serving reach the sweep,
/// which only starts their clocks in a scoped pass.
pub fn staleness_in(
    e: &Entry,
    model: &FamilyModel,
    host_ips: &HashSet<IpAddr>,
    removed: &Removed,
    scope: Option<&Scope>,
) -> Option<Stale> {
    let flow = flow_of(e);
    match scope {
        None => staleness(&flow, model, host_ips, removed),
        Some(s) if !s.touches(flow.orig_dst, flow.reply_src.ip()) => None,
        Some(_) => staleness(&flow, model, host_ips, removed)
            .filter(|why| *why != Stale::OrphanedServiceIp),
    }
}

/// What the rules judge of `e` ([`Flow`]): its protocol, original destination and reply source.
pub fn flow_of(e: &Entry) -> Flow {
    Flow {
        udp: e.orig.proto == IPPROTO_UDP,
        orig_dst: SocketAddr::new(e.orig.dst, e.orig.dst_port),
        reply_src: SocketAddr::new(e.reply.src, e.reply.src_port),
    }
}

/// Reads the table for one pass into `sweep`: the kernel-filtered dumps of a scope when they
/// can ask for it and the kernel takes their filter, else one dump of the family (UDP only
/// while the kernel takes that filter). Each stale entry is judged once; the reads are counted
/// in the sweep's report. A filter the kernel rejects is remembered (`kernel_filter`: the
/// protocol filter; `select_filter`: a triggered pass's) and the pass reads without it.
fn read_table(
    table: &mut dyn Table,
    family: Family,
    (kernel_filter, select_filter): (&mut bool, &mut bool),
    scope: Option<&Scope>,
    sweep: &mut Sweep<'_>,
) -> Result<(), DumpError> {
    let selected = scope
        .filter(|_| *select_filter)
        .and_then(|s| selections(family, s));
    // Selections whose dump ended: an entry one of them returned was judged there (an entry
    // of a frontend and of its removed backend is returned by both, deleted once).
    let mut done: Vec<Select> = Vec::new();
    if let Some(selections) = selected {
        // The selections' reads add up (each dump sets `scanned` to its own).
        let mut scanned = 0;
        let mut rejected = false;
        for select in selections {
            let what = Dump::Select(family, IPPROTO_UDP, select);
            let r = dump_retrying(table, what, family, &done, sweep);
            scanned += sweep.report.scanned;
            match r {
                Ok(()) => done.push(select),
                Err(DumpError::FilterRejected(e)) => {
                    tracing::warn!(error = %e, ?select, "kernel rejects the conntrack dump filter of a triggered pass; filtering here");
                    *select_filter = false;
                    rejected = true;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        sweep.report.scanned = scanned;
        if !rejected {
            return Ok(());
        }
        // What the accepted selections deleted stands; the dump below skips their entries.
        sweep.report.partial = false;
        sweep.report.dump_attempts = 0;
    }
    loop {
        let filter = kernel_filter.then_some(IPPROTO_UDP);
        match dump_retrying(table, Dump::Whole(family, filter), family, &done, sweep) {
            Ok(()) => return Ok(()),
            Err(DumpError::FilterRejected(e)) => {
                tracing::warn!(
                    %family, error = %e,
                    "kernel rejects the conntrack dump filter on the L4 protocol; dumping everything and filtering here"
                );
                *kernel_filter = false;
            }
            Err(e) => return Err(e),
        }
    }
}

/// One dump, retried while interrupted (up to [`MAX_DUMP_ATTEMPTS`], then the last partial
/// result is used, as upstream does), each entry judged by `sweep` as it streams; entries a
/// selection in `done` returns are skipped (judged by its dump). An interrupted attempt's
/// deletes already sent stand (each entry was stale on its own); what it still held is dropped
/// and judged again by the retry. A rejected filter is returned for the caller.
fn dump_retrying(
    table: &mut dyn Table,
    what: Dump,
    family: Family,
    done: &[Select],
    sweep: &mut Sweep<'_>,
) -> Result<(), DumpError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut visited = 0usize;
        let res = table.dump(what, &mut |e, del| {
            visited += 1;
            if !done.iter().any(|s| s.matches(e)) {
                sweep.visit(e, del);
            }
        });
        sweep.report.scanned = visited;
        match res {
            Ok(_) => break,
            Err(DumpError::Interrupted) if attempts < MAX_DUMP_ATTEMPTS => sweep.drop_attempt(),
            Err(DumpError::Interrupted) => {
                tracing::info!(
                    %family,
                    attempts,
                    "conntrack dump interrupted every time; continuing to clean with the partial result"
                );
                sweep.report.partial = true;
                break;
            }
            Err(e) => {
                sweep.drop_attempt();
                return Err(e);
            }
        }
    }
    sweep.report.dump_attempts += attempts;
    sweep.flush(table);
    Ok(())
}
