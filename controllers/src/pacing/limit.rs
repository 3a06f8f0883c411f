//! How many writes of a batch are kept in flight, adapted to what the apiserver answers.
//!
//! An AIMD limit (additive increase, multiplicative decrease, as TCP and Netflix's
//! concurrency-limits do). kube-controller-manager starts one goroutine per pod and collects
//! 7,500 pods with thousands of 429s; here a 429 halves the limit and pauses new starts for the
//! server's `Retry-After`, a latency well above the best seen recently trims it by a tenth,
//! and each answer that is neither grows it by 1/limit (one more per round trip), up to
//! the configured maximum (PodGC's `--gc-concurrency`). Pure: [`super::Pacer`] feeds it
//! answers and the clock.

use std::time::{Duration, Instant};

/// Without a Retry-After (the apiserver's max-inflight and APF filters send it as a header the
/// client does not surface), a 429 pauses new starts this long.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause a Retry-After gets. The apiserver asks for a second or a few; a webhook or
/// a proxy may ask for hours, which would stop every PodGC pass while `/readyz` says 200.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);
/// Latency counts as "rising" above this multiple of the recent best...
const LATENCY_FACTOR: f64 = 4.0;
/// ...and only above this absolute floor, so a fast local apiserver's jitter is not load.
const LATENCY_FLOOR: Duration = Duration::from_millis(100);

/// What one API answer says about the apiserver's load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Signal {
    /// Answered (success or a non-throttling error) after this long.
    Answered(Duration),
    /// 429 Too Many Requests, with the server's Retry-After if it gave one.
    Throttled(Option<Duration>),
}

#[derive(Debug, Clone)]
pub struct Aimd {
    limit: f64,
    max: f64,
    /// The best latency seen, drifting up slowly so an old best does not stick forever.
    best: Option<Duration>,
    /// No new start before this instant (Retry-After).
    pause_until: Option<Instant>,
    /// Decreases within one round trip of the last are one congestion event, not several.
    last_decrease: Option<Instant>,
    /// No additive increase before this: as long again as the pause after a 429, so a server
    /// that admits only a few writes is not probed again the moment the pause ends.
    hold_until: Option<Instant>,
}

impl Aimd {
    /// Starts at `max`: an idle apiserver gets the configured concurrency at once, and the
    /// first 429 halves it.
    pub fn new(max: usize) -> Self {
        let max = max.max(1) as f64;
        Self {
            limit: max,
            max,
            best: None,
            pause_until: None,
            last_decrease: None,
            hold_until: None,
        }
    }

    /// Deletes allowed in flight now.
    pub fn allowed(&self) -> usize {
        self.limit.floor().max(1.0) as usize
    }

    pub fn limit(&self) -> f64 {
        self.limit
    }

    /// When new starts may resume, if they are paused at `now`.
    pub fn paused(&self, now: Instant) -> Option<Instant> {
        self.pause_until.filter(|t| *t > now)
    }

    fn decrease(&mut self, factor: f64, now: Instant) {
        let window = self.best.unwrap_or(LATENCY_FLOOR).max(LATENCY_FLOOR);
        if self
            .last_decrease
            .is_some_and(|t| now.saturating_duration_since(t) < window)
        {
            return;
        }
        self.limit = (self.limit * factor).max(1.0);
        self.last_decrease = Some(now);
    }

    pub fn observe(&mut self, s: Signal, now: Instant) {
        match s {
            Signal::Throttled(retry_after) => {
                let pause = retry_after.unwrap_or(DEFAULT_PAUSE).min(RETRY_AFTER_MAX);
                let until = now + pause;
                self.pause_until = Some(self.pause_until.map_or(until, |t| t.max(until)));
                let hold = until + pause;
                self.hold_until = Some(self.hold_until.map_or(hold, |t| t.max(hold)));
                self.decrease(0.5, now);
            }
            Signal::Answered(latency) => {
                let best = match self.best {
                    // Drift up 1% per answer: a best from a quieter minute fades.
                    Some(b) => b.mul_f64(1.01).min(latency),
                    None => latency,
                };
                self.best = Some(best);
                let rising = latency > LATENCY_FLOOR
                    && latency.as_secs_f64() > best.as_secs_f64() * LATENCY_FACTOR;
                if rising {
                    self.decrease(0.9, now);
                } else if self.hold_until.is_some_and(|t| now < t) {
                    // Answers to what was admitted during the hold say little about more.
                } else {
                    self.limit = (self.limit + 1.0 / self.limit).min(self.max);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Each row: a start limit, then signals one tick (10 ms) apart; the limit and pause after.
    #[test]
    fn aimd_table() {
        let t0 = Instant::now();
        struct Row {
            what: &'static str,
            max: usize,
            signals: Vec<Signal>,
            allowed: usize,
            paused_for: Option<Duration>,
        }
        // Rows whose signals are 150 ms apart rather than 10 ms.
        let spaced = [
            "429s a round trip apart keep halving, never below 1",
            "after the hold, healthy answers grow it back additively",
        ];
        let ok = |ms: u64| Signal::Answered(MS * ms as u32);
        let rows = [
            Row {
                what: "healthy answers keep the configured maximum",
                max: 16,
                signals: vec![ok(5); 50],
                allowed: 16,
                paused_for: None,
            },
            Row {
                what: "a 429 halves the limit and pauses for the default second",
                max: 16,
                signals: vec![ok(5), Signal::Throttled(None)],
                allowed: 8,
                paused_for: Some(DEFAULT_PAUSE),
            },
            Row {
                what: "Retry-After is honoured",
                max: 16,
                signals: vec![ok(5), Signal::Throttled(Some(Duration::from_secs(3)))],
                allowed: 8,
                paused_for: Some(Duration::from_secs(3)),
            },
            Row {
                what: "a burst of 429s within one round trip is one halving",
                max: 16,
                signals: vec![Signal::Throttled(None); 5],
                // 5 signals 10 ms apart: all inside the 100 ms window.
                allowed: 8,
                paused_for: Some(DEFAULT_PAUSE),
            },
            Row {
                what: "429s a round trip apart keep halving, never below 1",
                max: 16,
                signals: vec![Signal::Throttled(None); 6],
                allowed: 1,
                paused_for: Some(DEFAULT_PAUSE),
            },
            Row {
                what: "rising latency trims the limit",
                max: 10,
                signals: vec![ok(20), ok(500)],
                allowed: 9,
                paused_for: None,
            },
            Row {
                what: "slow but steady (no rise above the best) is not load",
                max: 10,
                signals: vec![ok(300); 20],
                allowed: 10,
                paused_for: None,
            },
            Row {
                what: "jitter under the absolute floor is not load",
                max: 10,
                signals: vec![ok(1), ok(90)],
                allowed: 10,
                paused_for: None,
            },
            Row {
                what: "no growth during the pause and as long again after it",
                max: 16,
                signals: [vec![Signal::Throttled(None)], vec![ok(5); 8 * 3]].concat(),
                allowed: 8,
                // Answers to requests already in flight do not lift the pause.
                paused_for: Some(DEFAULT_PAUSE - MS * 240),
            },
            Row {
                what: "after the hold, healthy answers grow it back additively",
                max: 16,
                // At 150 ms apart the hold (2 s) covers the first 13 answers; 16 more follow.
                signals: [vec![Signal::Throttled(None)], vec![ok(5); 13 + 16]].concat(),
                allowed: 9,
                paused_for: None,
            },
        ];
        for r in rows {
            let mut a = Aimd::new(r.max);
            let tick = if spaced.contains(&r.what) {
                MS * 150
            } else {
                MS * 10
            };
            let mut now = t0;
            for s in &r.signals {
                a.observe(*s, now);
                now += tick;
            }
            now -= tick;
            assert_eq!(a.allowed(), r.allowed, "{}: limit {}", r.what, a.limit());
            assert_eq!(a.paused(now).map(|t| t - now), r.paused_for, "{}", r.what);
        }
    }

    /// A hostile or broken Retry-After: one of a day (a webhook, a proxy) paused every new delete
    /// for a day. It is capped; one within the cap is honoured as given.
    #[test]
    fn a_huge_retry_after_pauses_no_longer_than_the_cap() {
        let t0 = Instant::now();
        for (asked, want) in [
            (None, DEFAULT_PAUSE),
            (Some(Duration::from_secs(5)), Duration::from_secs(5)),
            (Some(RETRY_AFTER_MAX), RETRY_AFTER_MAX),
            (Some(Duration::from_secs(86_400)), RETRY_AFTER_MAX),
            (
                Some(Duration::from_secs(u64::from(u32::MAX))),
                RETRY_AFTER_MAX,
            ),
        ] {
            let mut a = Aimd::new(8);
            a.observe(Signal::Throttled(asked), t0);
            assert_eq!(a.paused(t0), Some(t0 + want), "{asked:?}");
            assert_eq!(a.paused(t0 + want), None, "{asked:?}: resumes");
        }
    }
}
