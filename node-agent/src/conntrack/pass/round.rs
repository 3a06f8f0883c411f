//! A round: each family's pass over the model, run on the thread that owns the netlink socket,
//! off the async runtime (netlink calls block). With a namespace name the thread lives in that
//! namespace, so its socket and its reads of /proc/sys/net do too.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::fill::Fill;
use crate::conntrack::apply::Table;
use crate::conntrack::metrics::Metrics;
use crate::conntrack::model::Model;
use crate::conntrack::model::changes::Changes;
use crate::conntrack::model::focus::Focus;
use crate::conntrack::netlink::family::{Family, PerFamily};
use crate::conntrack::netlink::socket::DumpError;
use crate::conntrack::pass::{PassContext, PassError, PassState, run_focused_pass};

/// Fill ratio above which every pass logs a warning (and, once per crossing, a Node Event).
const FILL_WARNING: f64 = super::fill::THRESHOLD;

/// Totals of one round (both families), for the adaptive interval.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct RoundSummary {
    pub scanned: usize,
    pub deleted: usize,
    /// The table's fill, read at the start of the round (None when unreadable).
    pub fill: Option<Fill>,
    /// Flows to orphaned service IPs were kept for their grace: a full round in this long
    /// deletes them.
    pub recheck_in: Option<Duration>,
}

struct Request {
    model: Arc<Model>,
    /// Only the entries in each family's scope (a triggered round); `None`: every entry.
    focus: Option<Focus>,
    /// What changed since the model the last round judged; `None` for the first round.
    since: Option<Changes>,
    reply: oneshot::Sender<RoundSummary>,
}

/// The thread that runs rounds, one at a time.
pub struct RoundThread {
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RoundThread {
    pub fn start(
        netns: Option<String>,
        metrics: Metrics,
        table: Box<dyn Table + Send>,
        orphan_grace: Duration,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Request>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("conntrack".into())
            .spawn(move || {
                if let Some(ns) = &netns
                    && let Err(e) = enter_netns(ns)
                {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                let _ = ready_tx.send(Ok(()));
                let mut round = Round {
                    table,
                    metrics,
                    state: PerFamily([(); 2].map(|()| PassState {
                        orphan_grace,
                        ..PassState::default()
                    })),
                };
                for Request {
                    model,
                    focus,
                    since,
                    reply,
                } in rx
                {
                    round.observe(&model, since.as_ref());
                    let summary = round.run(&model, focus.as_ref());
                    // Let go of the model before the scheduler hears the round is over: its
                    // next update then changes the model in place instead of copying it.
                    drop(model);
                    let _ = reply.send(summary);
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("conntrack thread died while starting"))??;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Runs one round (IPv4 then IPv6) and waits for it. With `focus`, each family's pass
    /// judges only the entries in that family's scope. `since`: what changed since the model
    /// the last round judged (`None` for the first round).
    pub async fn run(
        &self,
        model: Arc<Model>,
        focus: Option<Focus>,
        since: Option<Changes>,
    ) -> RoundSummary {
        let (reply, rx) = oneshot::channel();
        let sent = self.tx.as_ref().is_some_and(|tx| {
            tx.send(Request {
                model,
                focus,
                since,
                reply,
            })
            .is_ok()
        });
        if !sent {
            return RoundSummary::default();
        }
        rx.await.unwrap_or_default()
    }
}

impl Drop for RoundThread {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Round {
    table: Box<dyn Table + Send>,
    metrics: Metrics,
    state: PerFamily<PassState>,
}

impl Round {
    /// Records the backends that stopped serving between the last model judged and `model`.
    /// Rounds run in the order their models were built, so this sees every removal that
    /// outlived a round; a backend added and removed between two rounds was never seen serving.
    ///
    /// `since` holds the old values of what changed since that model (see [`Changes`]): what
    /// a key served then and no longer does now is read from them, not from a copy of that
    /// model held until this round (which would make every update copy the model whole).
    fn observe(&mut self, model: &Model, since: Option<&Changes>) {
        let now = Instant::now();
        let seen = since.map(|c| (c.old(), c.now_in(model)));
        for fam in Family::ALL {
            let removed = &mut self.state[fam].graces.removed;
            match &seen {
                Some((old, new)) => removed.observe(&old[fam], &new[fam], now),
                None => removed.expire(now),
            }
        }
    }

    fn run(&mut self, model: &Model, focus: Option<&Focus>) -> RoundSummary {
        let mut summary = RoundSummary {
            fill: self.observe_fill(),
            ..RoundSummary::default()
        };
        for fam in Family::ALL {
            let label = fam.label();
            let focus = focus.map(|f| &f[fam]);
            let start = Instant::now();
            let res = run_focused_pass(
                &mut *self.table,
                fam,
                &model[fam],
                &mut self.state[fam],
                focus,
                start,
            );
            let elapsed = start.elapsed();
            // Whether the pass listed the whole table: upstream observes the latency only then.
            let (report, listed) = match res {
                Ok(r) if r.skipped => {
                    tracing::debug!(
                        ip_family = label,
                        "conntrack pass skipped: nothing to judge in this family"
                    );
                    continue;
                }
                Ok(r) => (r, true),
                Err(e) => {
                    self.metrics
                        .failures
                        .with_label_values(&[label, e.metric_label()])
                        .inc();
                    match e {
                        PassError::Dump(DumpError::Open(e)) => {
                            tracing::error!(ip_family = label, error = %e, "cannot open the conntrack netlink socket (needs CAP_NET_ADMIN); pass skipped");
                            return summary;
                        }
                        PassError::Dump(e) => {
                            tracing::error!(ip_family = label, error = %e, "failed to list conntrack entries; nothing deleted");
                            continue;
                        }
                        PassError::DumpAfterDeletes { report, source } => {
                            tracing::error!(ip_family = label, error = %source, deleted = report.deleted, "listing conntrack entries failed after some stale ones were deleted; the rest is left to the next pass");
                            (*report, false)
                        }
                        PassError::Delete { report, source } => {
                            tracing::error!(ip_family = label, error = %source, deleted = report.deleted, "deleting stale conntrack entries failed");
                            (*report, true)
                        }
                    }
                }
            };
            if listed {
                self.metrics
                    .pass_duration
                    .with_label_values(&[label])
                    .observe(elapsed.as_secs_f64());
            }
            // What was deleted before a failed list was deleted: counted all the same.
            self.metrics
                .deleted
                .with_label_values(&[label])
                .inc_by(report.deleted as u64);
            self.metrics
                .scanned
                .with_label_values(&[label])
                .inc_by(report.scanned as u64);
            summary.scanned += report.scanned;
            summary.deleted += report.deleted;
            summary.recheck_in = summary
                .recheck_in
                .into_iter()
                .chain(report.orphans_due_in)
                .min();
            report.log(&PassContext {
                family: fam,
                scope: focus.map(|s| (s.frontends.len(), s.node_ports.len(), s.backends.len())),
                dry_run: self.table.dry_run(),
                kernel_filter: self.state[fam].kernel_filter,
                elapsed,
            });
        }
        summary
    }

    fn observe_fill(&self) -> Option<Fill> {
        let read = |name: &str| -> Option<f64> {
            std::fs::read_to_string(format!("/proc/sys/net/netfilter/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let (Some(count), Some(max)) = (read("nf_conntrack_count"), read("nf_conntrack_max"))
        else {
            return None;
        };
        if max <= 0.0 {
            return None;
        }
        let ratio = count / max;
        self.metrics.fill_ratio.set(ratio);
        if ratio > FILL_WARNING {
            tracing::warn!(
                nf_conntrack_count = count,
                nf_conntrack_max = max,
                ratio,
                "conntrack table is over 80% full; new flows will be dropped when it is full (raise --conntrack-max-per-core / --conntrack-min)"
            );
        }
        Some(Fill { count, max })
    }
}

/// Moves the calling thread (only it) into the named namespace. Use on a thread of your own
/// (the round's thread with --conntrack-netns; tests' threads).
pub fn enter_netns(name: &str) -> io::Result<()> {
    let path = format!("/run/netns/{name}");
    let file = File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    // SAFETY: setns on a valid namespace fd affects only this thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("setns {path}: {e}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::conntrack::decide::Stale;
    use crate::conntrack::netlink::socket::BatchReport;
    use crate::conntrack::{
        apply::{Delete, Dump},
        netlink::msg::Entry,
    };

    /// Makes the error a dump fails with.
    type Fail = fn() -> DumpError;

    /// A table whose every dump fails with `fail`.
    struct Failing(Fail);

    impl Table for Failing {
        fn dump(
            &mut self,
            _: Dump,
            _: &mut dyn FnMut(&Entry, &mut dyn Delete),
        ) -> Result<usize, DumpError> {
            Err((self.0)())
        }
        fn host_addresses(&mut self) -> io::Result<HashSet<std::net::IpAddr>> {
            Ok(HashSet::new())
        }
    }

    impl Delete for Failing {
        fn delete(&mut self, _: &[(Entry, Stale)]) -> io::Result<BatchReport> {
            unreachable!("nothing was listed")
        }
    }

    #[test]
    fn a_failed_pass_is_counted_under_its_error() {
        let table: [(Fail, &str); 3] = [
            (
                || DumpError::Open(io::Error::from_raw_os_error(libc::EPERM)),
                "socket_open",
            ),
            (
                || DumpError::Kernel(io::Error::from_raw_os_error(libc::ENOBUFS)),
                "kernel",
            ),
            (
                || DumpError::Io(io::Error::from(io::ErrorKind::UnexpectedEof)),
                "io",
            ),
        ];
        for (fail, want) in table {
            let metrics = Metrics::register(&prometheus::Registry::new()).unwrap();
            let mut model = Model::default();
            model[Family::V4].frontends.insert(
                "10.96.0.10:53".parse().unwrap(),
                ["10.244.1.5:53".parse().unwrap()].into(),
            );
            let mut round = Round {
                table: Box::new(Failing(fail)),
                metrics: metrics.clone(),
                state: PerFamily::default(),
            };
            round.run(&model, None);
            for label in [
                "socket_open",
                "interrupted",
                "filter_rejected",
                "kernel",
                "io",
                "parse",
                "delete",
            ] {
                assert_eq!(
                    metrics.failures.with_label_values(&["IPv4", label]).get(),
                    u64::from(label == want),
                    "{want}: {label}"
                );
            }
            assert_eq!(
                latency_samples(&metrics),
                0,
                "{want}: a failed list is no pass"
            );
        }
    }

    fn latency_samples(metrics: &Metrics) -> u64 {
        metrics
            .pass_duration
            .with_label_values(&["IPv4"])
            .get_sample_count()
    }

    /// Upstream observes the pass latency only after a list that succeeded (a failed delete
    /// included); entries deleted before a list failed are counted all the same.
    #[test]
    fn the_latency_is_observed_only_after_a_whole_list() {
        use crate::conntrack::pass::pass_tests::{Fake, flow, model};
        use crate::conntrack::{netlink::msg::IPPROTO_UDP, pass::PassState};
        let stale = || {
            (1..=3)
                .map(|port| flow(IPPROTO_UDP, port, "10.244.9.9:53"))
                .collect::<Vec<_>>()
        };
        let io_error: fn() -> DumpError = || DumpError::Io(io::ErrorKind::UnexpectedEof.into());
        // (what, table, want failure label, want latency samples, want deleted)
        let cases: [(&str, Fake, Option<&str>, u64, u64); 3] = [
            (
                "whole list",
                Fake::new(stale(), vec![(3, Ok(()))]),
                None,
                1,
                3,
            ),
            (
                "list failed after deletes",
                Fake::new(stale(), vec![(2, Err(io_error))]),
                Some("io"),
                0,
                2,
            ),
            (
                "deletes failed",
                {
                    let mut t = Fake::new(stale(), vec![(3, Ok(()))]);
                    t.delete_result = Some(|| io::Error::from_raw_os_error(libc::EPERM));
                    t
                },
                Some("delete"),
                1,
                0,
            ),
        ];
        for (what, table, failure, samples, deleted) in cases {
            let metrics = Metrics::register(&prometheus::Registry::new()).unwrap();
            let mut state = PerFamily::<PassState>::default();
            state[Family::V4] = PassState {
                delete_batch: 1,
                ..PassState::seen_all()
            };
            let mut round = Round {
                table: Box::new(table),
                metrics: metrics.clone(),
                state,
            };
            let mut m = Model::default();
            m[Family::V4] = model();
            round.run(&m, None);
            for label in ["io", "delete"] {
                assert_eq!(
                    metrics.failures.with_label_values(&["IPv4", label]).get(),
                    u64::from(failure == Some(label)),
                    "{what}: {label}"
                );
            }
            assert_eq!(latency_samples(&metrics), samples, "{what}");
            assert_eq!(
                metrics.deleted.with_label_values(&["IPv4"]).get(),
                deleted,
                "{what}"
            );
        }
    }
}
