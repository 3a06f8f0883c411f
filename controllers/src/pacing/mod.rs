//! Pacing a batch of API writes to what the apiserver answers, for any controller that writes
//! in bulk (PodGC's deletions today; ServiceCIDR's finalizer and status writes could run
//! through it the same way).
//!
//! Two jobs, each on its own: [`limit::Aimd`] says how many writes may be in flight and when
//! new starts are paused; [`Pacer::run`] starts the batch's items within that limit, and sends
//! an item whose attempt the apiserver throttled (429) back to the front of the queue, through
//! the limit (and its pause) again, up to [`THROTTLED_ATTEMPTS`]. What stops new starts
//! (shutdown, a lost lease, a stale cache) is the caller's [`Halt`].

pub mod limit;

use std::{
    collections::VecDeque,
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use futures::{FutureExt, StreamExt, future::BoxFuture, stream::FuturesUnordered};

use limit::{Aimd, Signal};

/// Attempts per item while the apiserver answers 429.
pub const THROTTLED_ATTEMPTS: u32 = 5;

/// A 429, and how long the server asked to wait (only when it said so in the Status body).
pub fn throttled_of(e: &kube::Error) -> Option<Option<Duration>> {
    match e {
        kube::Error::Api(s) if s.code == 429 => Some(
            s.details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(u64::from(s))),
        ),
        _ => None,
    }
}

/// What the pacer reads off an attempt's outcome.
pub trait Answer {
    /// The apiserver answered 429: the item is tried again, after the pause.
    fn throttled(&self) -> bool;
}

/// When no new attempt starts: the caller's reasons (shutdown, leadership, a stale cache).
pub trait Halt {
    fn halted(&self) -> bool;
    /// Resolves when [`Halt::halted`] may have turned true, to end a wait for a pause.
    fn on_halt(&self) -> BoxFuture<'_, ()>;
}

/// The limit of one kind of write, shared by every batch and cycle: the apiserver's load does
/// not reset between them.
#[derive(Clone)]
pub struct Pacer {
    limit: Arc<Mutex<Aimd>>,
    /// The configured maximum in flight.
    max: usize,
    /// The limit now, for the component's gauge.
    gauge: prometheus::Gauge,
}

impl Pacer {
    pub fn new(max: usize, gauge: prometheus::Gauge) -> Self {
        let limit = Aimd::new(max);
        gauge.set(limit.limit());
        Self {
            limit: Arc::new(Mutex::new(limit)),
            max,
            gauge,
        }
    }

    /// The configured maximum in flight.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The limit as it stands (for tests and logs).
    pub fn limit(&self) -> MutexGuard<'_, Aimd> {
        self.limit.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Feeds one answer to the limit.
    pub fn observe(&self, signal: Signal) {
        let mut l = self.limit();
        l.observe(signal, Instant::now());
        self.gauge.set(l.limit());
    }

    /// (attempts allowed in flight, when a 429 pause ends)
    fn gate(&self) -> (usize, Option<Instant>) {
        let l = self.limit();
        (l.allowed(), l.paused(Instant::now()))
    }

    /// Runs `attempt` on each item, as many at a time as the limit allows, and hands each
    /// final outcome to `done`. A throttled item goes back to the front of the queue and
    /// through the limit again: retries never pile onto an apiserver that just said 429.
    /// `attempt` is given the attempt number (from 1) and reports the answer's signal through
    /// [`Pacer::observe`]. Returns how many items were not started once `halt` said stop.
    pub async fn run<T, O, F, Fut>(
        &self,
        items: Vec<T>,
        halt: &(dyn Halt + Sync),
        attempt: F,
        mut done: impl FnMut(T, O),
    ) -> usize
    where
        O: Answer,
        F: Fn(T, u32) -> Fut,
        Fut: Future<Output = (T, O)>,
    {
        let mut queue: VecDeque<(T, u32)> = items.into_iter().map(|d| (d, 1)).collect();
        let mut in_flight = FuturesUnordered::new();
        loop {
            let mut resume = None;
            while !queue.is_empty() && !halt.halted() {
                let (allowed, paused) = self.gate();
                if paused.is_some() {
                    resume = paused;
                    break;
                }
                if in_flight.len() >= allowed.min(self.max.max(1)) {
                    break;
                }
                let Some((item, n)) = queue.pop_front() else {
                    break;
                };
                in_flight.push(attempt(item, n).map(move |(item, o)| (item, n, o)));
            }
            if in_flight.is_empty() && (queue.is_empty() || halt.halted()) {
                return queue.len();
            }
            let resumed = async {
                match resume {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((item, n, o)) = in_flight.next(), if !in_flight.is_empty() => {
                    if o.throttled() && n < THROTTLED_ATTEMPTS {
                        queue.push_front((item, n + 1));
                        continue;
                    }
                    done(item, o);
                }
                _ = resumed => {}
                _ = halt.on_halt(), if in_flight.is_empty() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Debug, PartialEq)]
    enum Said {
        Ok,
        TooMany,
    }

    impl Answer for Said {
        fn throttled(&self) -> bool {
            *self == Said::TooMany
        }
    }

    /// Stops after `after` starts.
    struct After {
        after: usize,
        started: AtomicUsize,
    }

    impl Halt for After {
        fn halted(&self) -> bool {
            self.started.load(Ordering::SeqCst) >= self.after
        }
        fn on_halt(&self) -> BoxFuture<'_, ()> {
            Box::pin(std::future::pending())
        }
    }

    fn pacer(max: usize) -> Pacer {
        Pacer::new(max, prometheus::Gauge::new("g", "g").unwrap())
    }

    #[tokio::test]
    async fn a_throttled_item_is_retried_up_to_the_bound_and_the_rest_run() {
        let p = pacer(4);
        let never = After {
            after: usize::MAX,
            started: 0.into(),
        };
        let tries = Mutex::new(Vec::new());
        let mut done = Vec::new();
        let left = p
            .run(
                vec!["slow", "a", "b"],
                &never,
                |item, n| {
                    tries.lock().unwrap().push((item, n));
                    async move {
                        (
                            item,
                            if item == "slow" {
                                Said::TooMany
                            } else {
                                Said::Ok
                            },
                        )
                    }
                },
                |item, o| done.push((item, o)),
            )
            .await;
        assert_eq!(left, 0);
        done.sort_by_key(|(i, _)| *i);
        assert_eq!(
            done,
            [("a", Said::Ok), ("b", Said::Ok), ("slow", Said::TooMany)],
            "a throttled item ends as throttled after its last attempt"
        );
        let slow: Vec<u32> = tries
            .lock()
            .unwrap()
            .iter()
            .filter(|(i, _)| *i == "slow")
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(slow, (1..=THROTTLED_ATTEMPTS).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn nothing_starts_once_halted_and_the_rest_are_counted() {
        let p = pacer(1);
        let halt = After {
            after: 2,
            started: 0.into(),
        };
        let mut done = 0;
        let left = p
            .run(
                (0..5).collect(),
                &halt,
                |i: u32, _| {
                    halt.started.fetch_add(1, Ordering::SeqCst);
                    async move { (i, Said::Ok) }
                },
                |_, _| done += 1,
            )
            .await;
        assert_eq!((done, left), (2, 3));
    }

    /// The limit is what bounds the items in flight; a 429 halves it and pauses new starts.
    #[tokio::test]
    async fn in_flight_never_exceeds_the_limit_and_a_429_pauses_starts() {
        let p = pacer(3);
        let never = After {
            after: usize::MAX,
            started: 0.into(),
        };
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        p.run(
            (0..20).collect(),
            &never,
            |i: u32, _| {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                let now = &now;
                async move {
                    tokio::task::yield_now().await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    (i, Said::Ok)
                }
            },
            |_, _| {},
        )
        .await;
        assert_eq!(most.load(Ordering::SeqCst), 3);
        p.observe(Signal::Throttled(None));
        assert_eq!(p.limit().allowed(), 1, "halved from 3");
        assert!(p.limit().paused(Instant::now()).is_some());
        assert_eq!(p.gauge.get(), 1.5);
    }

    #[test]
    fn a_429_is_read_off_the_status_with_its_retry_after() {
        let status = |code: u16, retry: Option<i32>| {
            let mut s = kube::core::Status::failure("x", "TooManyRequests").with_code(code);
            s.details = retry.map(|r| {
                serde_json::from_value(serde_json::json!({ "retryAfterSeconds": r })).unwrap()
            });
            kube::Error::Api(s.boxed())
        };
        assert_eq!(
            throttled_of(&status(429, Some(3))),
            Some(Some(Duration::from_secs(3)))
        );
        assert_eq!(throttled_of(&status(429, None)), Some(None));
        assert_eq!(throttled_of(&status(429, Some(0))), Some(None));
        assert_eq!(throttled_of(&status(500, Some(3))), None);
    }
}
