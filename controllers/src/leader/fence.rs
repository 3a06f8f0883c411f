//! The fence every controller write passes through: a write is started only while this replica
//! holds a valid lease, and is abandoned in flight the moment that validity ends.
//!
//! Validity is judged on the local clock (monotonic, plus time suspended: `clock.rs`) against an
//! instant the elector publishes
//! (the start of the last successful renewal + the renew deadline), not against a flag the
//! elector has to flip in time: a hung elector, a stopped process that wakes up, or a timer that
//! has not fired yet can not make a write look allowed once that instant has passed. A standby
//! takes the lease over no earlier than lease duration after it saw that renewal, which is after
//! that instant by at least lease duration - renew deadline (5 s with the defaults): the margin
//! for a write already on the wire to land.

use std::{future::Future, task::Poll};

use tokio::sync::watch;

use super::clock::Stamp;

/// How long this replica may act.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Term {
    /// Not leading: a standby, or a leader that lost (or gave up) its lease.
    Standby,
    /// Leading until this stamp is reached, time suspended included.
    Until(Stamp),
    /// `--leader-elect=false`: the only replica, always acting.
    Unbounded,
}

impl Term {
    /// The lease-validity predicate.
    pub fn valid_at(self, now: Stamp) -> bool {
        match self {
            Term::Standby => false,
            Term::Until(end) => !now.reached(end),
            Term::Unbounded => true,
        }
    }
}

/// A write refused (or abandoned in flight) because this replica no longer leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not leading (lease not held or no longer valid): write not made")]
pub struct Fenced;

/// The Event writer's writes pass the fence like every other write; refused or dropped, they
/// fail as the other writes do (`Service` error carrying [`Fenced`]).
impl groundskeeper_plumbing::events::Fence for Fence {
    fn guard<'a>(
        &'a self,
        write: futures::future::BoxFuture<'a, Result<(), kube::Error>>,
    ) -> futures::future::BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async move {
            Fence::guard(self, write)
                .await
                .unwrap_or_else(|f| Err(kube::Error::Service(Box::new(f))))
        })
    }
}

/// A read-only view of the elector's [`Term`], cheap to clone into every writer.
#[derive(Clone)]
pub struct Fence(watch::Receiver<Term>);

impl Fence {
    pub(crate) fn new(rx: watch::Receiver<Term>) -> Self {
        Self(rx)
    }

    /// Always valid: `--leader-elect=false`, and unit tests of the write layers.
    pub fn unbounded() -> Self {
        let (tx, rx) = watch::channel(Term::Unbounded);
        // Keep the sender alive for the life of the process so the term never ends.
        std::mem::forget(tx);
        Self(rx)
    }

    pub(super) fn watch(&self) -> watch::Receiver<Term> {
        self.0.clone()
    }

    pub fn term(&self) -> Term {
        *self.0.borrow()
    }

    /// True if a write may start now.
    pub fn is_valid(&self) -> bool {
        self.term().valid_at(Stamp::now())
    }

    /// Resolves once this replica may no longer act: the term became Standby, its instant
    /// passed, or the elector is gone. Pending forever for an unbounded term.
    pub async fn lost(&self) {
        let mut rx = self.0.clone();
        loop {
            let term = *rx.borrow_and_update();
            match term {
                Term::Standby => return,
                Term::Until(end) => {
                    if Stamp::now().reached(end) {
                        return;
                    }
                    tokio::select! {
                        // A renewal may have moved the instant on meanwhile: look again.
                        _ = tokio::time::sleep_until(end.wake_instant()) => {}
                        changed = rx.changed() => if changed.is_err() { return },
                    }
                }
                Term::Unbounded => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await
                    }
                }
            }
        }
    }

    /// Runs `call` only if the lease is valid now, and drops it (cancelling the request) as soon
    /// as the lease stops being valid. The clock is checked again before every poll of `call`:
    /// after the process was stopped (SIGSTOP, a paused VM) the deadline timer may not have
    /// fired yet when the task runs again, but the clock has moved on.
    pub async fn guard<F: Future>(&self, call: F) -> Result<F::Output, Fenced> {
        if !self.is_valid() {
            return Err(Fenced);
        }
        let lost = self.lost();
        let mut call = std::pin::pin!(call);
        let mut lost = std::pin::pin!(lost);
        std::future::poll_fn(|cx| {
            if !self.is_valid() || lost.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(Fenced));
            }
            call.as_mut().poll(cx).map(Ok)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        },
        time::Duration,
    };

    use tokio::time::Instant;

    use super::*;

    /// A fence whose term ends 10 s after `t0`, and the elector's end of it.
    fn term_of_10s(t0: Instant) -> (watch::Sender<Term>, Fence) {
        let (tx, rx) = watch::channel(Term::Until(Stamp::at(t0 + Duration::from_secs(10))));
        (tx, Fence::new(rx))
    }

    #[test]
    fn validity_table() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // The machine had been suspended 100 s in all when the term was granted.
        let awake = |at: Instant| Stamp { at, asleep: s(100) };
        let until = Term::Until(awake(t0 + s(10)));
        for (name, term, now, want) in [
            ("standby", Term::Standby, awake(t0), false),
            ("unbounded", Term::Unbounded, awake(t0 + s(1_000_000)), true),
            ("start", until, awake(t0), true),
            (
                "just before the end",
                until,
                awake(t0 + s(10) - Duration::from_nanos(1)),
                true,
            ),
            // The instant itself is already outside the term.
            ("the end", until, awake(t0 + s(10)), false),
            ("long after", until, awake(t0 + s(3600)), false),
            // CLOCK_MONOTONIC says 1 s passed, but the machine slept a minute meanwhile: a
            // standby elsewhere took over long ago.
            (
                "1 s awake after a 60 s suspend",
                until,
                Stamp {
                    at: t0 + s(1),
                    asleep: s(160),
                },
                false,
            ),
            (
                "1 s awake after a 5 s suspend",
                until,
                Stamp {
                    at: t0 + s(1),
                    asleep: s(105),
                },
                true,
            ),
        ] {
            assert_eq!(term.valid_at(now), want, "{name}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_makes_no_call() {
        let (_tx, rx) = watch::channel(Term::Standby);
        let fence = Fence::new(rx);
        let called = Arc::new(AtomicBool::new(false));
        let c = called.clone();
        let r = fence
            .guard(async move { c.store(true, Ordering::SeqCst) })
            .await;
        assert_eq!(r, Err(Fenced));
        assert!(!called.load(Ordering::SeqCst), "the call was never polled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_call_is_dropped_exactly_when_the_term_ends() {
        let t0 = Instant::now();
        let (_tx, fence) = term_of_10s(t0);
        let r = fence
            .guard(tokio::time::sleep(Duration::from_secs(3600)))
            .await;
        assert_eq!(r, Err(Fenced));
        assert_eq!(t0.elapsed(), Duration::from_secs(10));
        assert!(!fence.is_valid());
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_extend_the_term_and_a_loss_cancels_at_once() {
        let t0 = Instant::now();
        let (tx, fence) = term_of_10s(t0);
        // Renewed at +8 s (until +18 s), then lost at +12 s.
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(8)).await;
            tx.send_replace(Term::Until(Stamp::at(t0 + Duration::from_secs(18))));
            tokio::time::sleep(Duration::from_secs(4)).await;
            tx.send_replace(Term::Standby);
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        let r = fence
            .guard(tokio::time::sleep(Duration::from_secs(3600)))
            .await;
        assert_eq!(r, Err(Fenced));
        assert_eq!(t0.elapsed(), Duration::from_secs(12));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_finishes_in_term_returns_its_output() {
        let t0 = Instant::now();
        let (_tx, fence) = term_of_10s(t0);
        let r = fence
            .guard(async {
                tokio::time::sleep(Duration::from_secs(9)).await;
                7
            })
            .await;
        assert_eq!(r, Ok(7));
        assert_eq!(Fence::unbounded().guard(async { 1 }).await, Ok(1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_elector_going_away_ends_the_term() {
        let t0 = Instant::now();
        let (tx, fence) = term_of_10s(t0);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(tx);
        });
        fence.lost().await;
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
    }

    #[test]
    fn a_stopped_process_sees_the_clock_not_the_timer() {
        // No runtime is driving timers here, as after a SIGSTOP: the clock alone decides.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let (_tx, rx) =
                watch::channel(Term::Until(Stamp::now().plus(Duration::from_millis(20))));
            let fence = Fence::new(rx);
            std::thread::sleep(Duration::from_millis(30));
            assert!(!fence.is_valid());
            let r = fence.guard(async { "written" }).await;
            assert_eq!(r, Err(Fenced));
        });
    }
}
