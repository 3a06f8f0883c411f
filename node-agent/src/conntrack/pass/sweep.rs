//! What a pass does with each entry a dump streams to it: judge it, keep a stale one in a
//! batch of at most `cap` entries and delete the batch when it is full and when a dump ends.
//! The table and its stale list are never held: memory stays flat in both.
//!
//! Why deleting while the dump streams is safe: every staleness is of one entry alone (its
//! tuples against the model; [`crate::conntrack::decide::stale`]), never about what else the table holds,
//! and each delete names the entry the kernel just returned by tuple + ID, so an entry replaced
//! meanwhile is not touched (its delete fails as not found). The kernel's dump resumes after
//! the last entry it could not send yet, which the pass has not seen and so cannot have
//! deleted: deletes of entries already returned make it skip nothing. The one staleness that
//! depends on more than the entry, the grace of an orphaned service IP or of a backend the agent
//! never saw serve (and of the model's removal memory, fixed for the pass), is measured across passes
//! from the state the pass started with, and that state is updated only from the attempt the
//! pass used. What an attempt still holds when it turns out interrupted, or when the dump
//! fails, is dropped unsent: the retry judges those entries again as the table is now.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::report::PassReport;
use crate::conntrack::apply::Delete;
use crate::conntrack::decide::Stale;
use crate::conntrack::model::canonical;
use crate::conntrack::model::removed::Removed;
use crate::conntrack::netlink::msg::Entry;

/// Stale entries held before they are deleted (one netlink `sendmsg` carries 128).
pub const DELETE_BATCH: usize = 512;

/// Failed deletes logged one by one in a pass; the rest are only counted.
const FAILURES_LOGGED: usize = 5;

/// What a pass saw waiting for its grace (orphaned service IPs, backends never seen serving),
/// and since when each has (from earlier passes): flows to one are deleted once it has for the
/// grace period, by a full pass only (`may_delete`). A scoped pass sees only part of the table,
/// so it only starts clocks: whether a key was seen waiting *continuously* is settled by the
/// full passes, which forget every key they no longer see.
pub struct Grace<'a, K> {
    pub since: &'a HashMap<K, Instant>,
    pub grace: Duration,
    pub now: Instant,
    /// Whether this pass may delete a flow whose grace is over (a full pass).
    pub may_delete: bool,
    /// Seen in the current attempt.
    pub seen: HashSet<K>,
}

/// Orphaned service IPs, by the flow's original destination.
pub type Orphans<'a> = Grace<'a, IpAddr>;

/// A flow's way to a backend the agent never saw serve it: (original destination, reply
/// source). Keyed by the pair, not by the backend alone, so that a backend lagging on one
/// frontend never inherits the clock another frontend started.
pub type UnseenKey = (SocketAddr, SocketAddr);

/// Backends the agent never saw serve, by [`UnseenKey`].
pub type Unseen<'a> = Grace<'a, UnseenKey>;

impl<K: Copy + Eq + Hash> Grace<'_, K> {
    /// Whether a flow waiting on `k` may go now; remembers that `k` was seen waiting.
    fn due(&mut self, k: K) -> bool {
        self.seen.insert(k);
        let since = self.since.get(&k).copied().unwrap_or(self.now);
        self.may_delete && self.now.saturating_duration_since(since) >= self.grace
    }
}

/// What passes carry from one to the next for their graces: since when each orphaned service IP
/// and each way to a backend never seen serving has been seen waiting, and the backends seen
/// removed (whose flows wait no grace). A pass borrows it whole while its dump streams
/// ([`Graces::clocks`], and the removals for judging), then takes in what it saw
/// ([`Graces::after_pass`]); a pass that fails leaves it as it was.
#[derive(Debug, Clone, Default)]
pub struct Graces {
    /// IP -> first pass that saw DNATed flows to it while no IPAddress held it. Forgotten as
    /// soon as a pass no longer sees it orphaned.
    pub orphans: HashMap<IpAddr, Instant>,
    /// (frontend, backend) -> first pass that saw flows judged [`Stale::UnseenBackend`] on that
    /// way. Forgotten as soon as a full pass no longer sees any.
    pub unseen: HashMap<UnseenKey, Instant>,
    /// Backends the agent saw stop serving a key (fed by the round with each model it judges).
    pub removed: Removed,
}

impl Graces {
    /// Everything counts as seen removed: for tests of other rules (streaming, focus, retries),
    /// where flows to not-serving backends go at once.
    #[cfg(test)]
    pub fn seen_all() -> Self {
        Self {
            removed: Removed::everything(),
            ..Self::default()
        }
    }

    /// The clocks a pass at `now` measures `grace` on: orphaned service IPs in a `full` pass
    /// only; unseen backends in every pass, deleted by a full one only (a rollout's flows are
    /// met first by the triggered pass its change asks for, which starts their clocks, so their
    /// grace is not put off to the next full pass).
    pub fn clocks(
        &self,
        grace: Duration,
        now: Instant,
        full: bool,
    ) -> (Option<Orphans<'_>>, Option<Unseen<'_>>) {
        let orphans = full.then(|| Orphans {
            since: &self.orphans,
            grace,
            now,
            may_delete: true,
            seen: HashSet::new(),
        });
        let unseen = Some(Unseen {
            since: &self.unseen,
            grace,
            now,
            may_delete: full,
            seen: HashSet::new(),
        });
        (orphans, unseen)
    }

    /// Takes in what a pass at `now` saw waiting (`None`: it did not look): a key seen for the
    /// first time starts its clock, and one no longer seen is forgotten, except by a scoped
    /// pass (not `full`), which saw only part of the table and forgets no unseen backend.
    /// Returns when a full pass is next due for a `grace` that runs out.
    pub fn after_pass(
        &mut self,
        orphans: Option<HashSet<IpAddr>>,
        unseen: Option<HashSet<UnseenKey>>,
        full: bool,
        grace: Duration,
        now: Instant,
    ) -> Option<Duration> {
        if let Some(seen) = orphans {
            self.orphans.retain(|ip, _| seen.contains(ip));
            for ip in seen {
                self.orphans.entry(ip).or_insert(now);
            }
        }
        if let Some(seen) = unseen {
            if full {
                self.unseen.retain(|b, _| seen.contains(b));
            }
            for b in seen {
                self.unseen.entry(b).or_insert(now);
            }
        }
        self.orphans
            .values()
            .chain(self.unseen.values())
            .map(|since| (*since + grace).saturating_duration_since(now))
            .filter(|d| !d.is_zero())
            .min()
    }
}

/// The [`UnseenKey`] of a flow.
pub fn unseen_key(e: &Entry) -> UnseenKey {
    (
        SocketAddr::new(canonical(e.orig.dst), e.orig.dst_port),
        SocketAddr::new(canonical(e.reply.src), e.reply.src_port),
    )
}

/// One pass's judging and deleting, entry by entry.
pub struct Sweep<'a> {
    staleness: &'a dyn Fn(&Entry) -> Option<Stale>,
    orphans: Option<Orphans<'a>>,
    unseen: Option<Unseen<'a>>,
    batch: Vec<(Entry, Stale)>,
    cap: usize,
    pub report: PassReport,
    /// The first delete that failed as a whole; nothing is deleted after it.
    pub failed: Option<io::Error>,
    /// Whether any delete was sent in this pass.
    pub sent: bool,
    failures_logged: usize,
}

impl<'a> Sweep<'a> {
    /// `orphans`, `unseen`: flows to orphaned service IPs and to backends never seen serving
    /// wait for their grace (`None`: such flows are never deleted).
    pub fn new(
        staleness: &'a dyn Fn(&Entry) -> Option<Stale>,
        orphans: Option<Orphans<'a>>,
        unseen: Option<Unseen<'a>>,
        cap: usize,
    ) -> Self {
        let cap = cap.max(1);
        Self {
            staleness,
            orphans,
            unseen,
            batch: Vec::with_capacity(cap),
            cap,
            report: PassReport::default(),
            failed: None,
            sent: false,
            failures_logged: 0,
        }
    }

    /// Judges one entry of the dump; deletes the batch through `del` once it is full.
    pub fn visit(&mut self, e: &Entry, del: &mut dyn Delete) {
        let Some(why) = (self.staleness)(e) else {
            return;
        };
        if why == Stale::OrphanedServiceIp
            && let Some(o) = &mut self.orphans
            && !o.due(canonical(e.orig.dst))
        {
            self.report.orphans_pending += 1;
            return;
        }
        if why == Stale::UnseenBackend {
            // Without a grace to measure, never deleted here.
            if !self.unseen.as_mut().is_some_and(|u| u.due(unseen_key(e))) {
                self.report.unseen_pending += 1;
                return;
            }
        }
        if self.failed.is_some() {
            // Counted, never sent: the deletes stopped at the failure.
            self.report.stale += 1;
            return;
        }
        self.batch.push((*e, why));
        if self.batch.len() >= self.cap {
            self.flush(del);
        }
    }

    /// Deletes what the batch holds (a dump ended, or it is full).
    pub fn flush(&mut self, del: &mut dyn Delete) {
        if self.batch.is_empty() {
            return;
        }
        self.report.stale += self.batch.len();
        if self.failed.is_none() {
            self.sent = true;
            match del.delete(&self.batch) {
                Ok(b) => {
                    self.report.deleted += b.ok;
                    self.report.already_gone += b.not_found;
                    self.report.failed_deletes += b.failed.len();
                    for (i, errno) in &b.failed {
                        if self.failures_logged == FAILURES_LOGGED {
                            break;
                        }
                        self.failures_logged += 1;
                        tracing::warn!(
                            entry = %self.batch[*i].0, error = %io::Error::from_raw_os_error(*errno),
                            "deleting a stale conntrack entry failed"
                        );
                    }
                }
                Err(e) => self.failed = Some(e),
            }
        }
        self.batch.clear();
    }

    /// An attempt is over without its end (interrupted and retried, or failed): what it
    /// still holds is dropped unsent, and what it saw of orphans forgotten.
    pub fn drop_attempt(&mut self) {
        self.batch.clear();
        self.report.orphans_pending = 0;
        self.report.unseen_pending = 0;
        if let Some(o) = &mut self.orphans {
            o.seen.clear();
        }
        if let Some(u) = &mut self.unseen {
            u.seen.clear();
        }
    }

    /// The orphaned IPs and unseen backends the attempt used saw.
    pub fn into_parts(self) -> Parts {
        Parts {
            report: self.report,
            failed: self.failed,
            sent: self.sent,
            orphans: self.orphans.map(|o| o.seen),
            unseen: self.unseen.map(|u| u.seen),
        }
    }
}

/// What a sweep leaves: its report, the failed delete, whether any was sent, and what the
/// attempt used saw waiting.
pub struct Parts {
    pub report: PassReport,
    pub failed: Option<io::Error>,
    pub sent: bool,
    pub orphans: Option<HashSet<IpAddr>>,
    pub unseen: Option<HashSet<UnseenKey>>,
}
