//! The clock a leader's term is judged on: the monotonic clock, plus the time the machine spent
//! suspended.
//!
//! Why not CLOCK_MONOTONIC alone: it stops while the machine is suspended (a laptop lid, a VM
//! paused by its host with the guest told, `systemctl suspend`), CLOCK_BOOTTIME does not. A
//! leader suspended for a minute would wake with its term apparently still running and make its
//! queued writes, while a standby on another machine took the Lease over 15 s into the suspend.
//!
//! Why not CLOCK_BOOTTIME alone: tokio's timers and `Instant` are on CLOCK_MONOTONIC, and the
//! tests pause and advance that clock. So a [`Stamp`] is tokio's `Instant` together with how
//! long the machine had been suspended by then (CLOCK_BOOTTIME − CLOCK_MONOTONIC); the time
//! between two stamps counts both. Timers stay on tokio's clock: they only wake the elector,
//! which then judges by stamps (it wakes at least every retry period, so a leader that resumes
//! after its term gives the lease up within one; every fenced write checks its stamp before
//! each poll in the meantime).

use std::time::Duration;

use tokio::time::Instant;

/// A point in time for judging a term: the monotonic instant, and the machine's suspended time
/// up to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub at: Instant,
    pub asleep: Duration,
}

impl Stamp {
    pub fn now() -> Self {
        // A suspend between the two reads is harmless: monotonic time stands still during it,
        // so the stamp is the real time just before or just after it, both between the reads.
        Self {
            at: Instant::now(),
            asleep: suspended(),
        }
    }

    /// The monotonic instant `at` as a stamp, with the machine's suspended time as of now.
    pub fn at(at: Instant) -> Self {
        Self {
            at,
            asleep: suspended(),
        }
    }

    /// When a timer on tokio's clock must fire for `self` to be reached: earlier than `at` by
    /// the time the machine has been suspended since `self` was taken.
    pub fn wake_instant(self) -> Instant {
        let lag = suspended().saturating_sub(self.asleep);
        self.at.checked_sub(lag).unwrap_or_else(Instant::now)
    }

    /// `at` later, with the same suspended time (a deadline).
    pub fn plus(self, d: Duration) -> Self {
        Self {
            at: self.at + d,
            asleep: self.asleep,
        }
    }

    /// The time from `earlier` to `self`, suspend included (zero if `self` is not later).
    pub fn since(self, earlier: Stamp) -> Duration {
        self.at.saturating_duration_since(earlier.at) + self.asleep.saturating_sub(earlier.asleep)
    }

    /// Whether `self` is at or past `deadline`, suspend included.
    pub fn reached(self, deadline: Stamp) -> bool {
        self.at + self.asleep.saturating_sub(deadline.asleep) >= deadline.at
    }
}

/// How long the machine has been suspended since it booted: CLOCK_BOOTTIME − CLOCK_MONOTONIC.
///
/// The two clocks can not be read at once, and a thread preempted between the reads would
/// count the preemption as suspend (milliseconds on a loaded machine), making a lease look older, or
/// younger, than it is. So BOOTTIME is read between two reads of MONOTONIC and compared with
/// their midpoint (off by at most half the window), and the tightest of a few tries is kept.
pub fn suspended() -> Duration {
    const TIGHT: Duration = Duration::from_micros(20);
    let mut best: Option<(Duration, Duration)> = None;
    for _ in 0..5 {
        let before = read(libc::CLOCK_MONOTONIC);
        let boot = read(libc::CLOCK_BOOTTIME);
        let after = read(libc::CLOCK_MONOTONIC);
        let window = after.saturating_sub(before);
        let asleep = boot.saturating_sub(before + window / 2);
        if best.is_none_or(|(w, _)| window < w) {
            best = Some((window, asleep));
        }
        if window <= TIGHT {
            break;
        }
    }
    best.map(|(_, asleep)| asleep).unwrap_or_default()
}

fn read(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime writes only into it. Both
    // clocks exist on every Linux since 2.6.39, so it does not fail; if it did, `ts` stays 0.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(at: Instant, asleep_s: u64) -> Stamp {
        Stamp {
            at,
            asleep: Duration::from_secs(asleep_s),
        }
    }

    #[test]
    fn suspended_time_counts_between_stamps() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let renewed = stamp(t0, 100);
        let end = renewed.plus(s(10));
        for (name, now, since, reached) in [
            ("awake, in term", stamp(t0 + s(9), 100), s(9), false),
            ("awake, term over", stamp(t0 + s(10), 100), s(10), true),
            // CLOCK_MONOTONIC alone says 1 s: the term looked valid for 9 s more.
            ("suspended a minute", stamp(t0 + s(1), 160), s(61), true),
            (
                "suspended 8 s, 1 s awake",
                stamp(t0 + s(1), 108),
                s(9),
                false,
            ),
            (
                "suspended 9 s, 1 s awake",
                stamp(t0 + s(1), 109),
                s(10),
                true,
            ),
        ] {
            assert_eq!(now.since(renewed), since, "{name}");
            assert_eq!(now.reached(end), reached, "{name}");
        }
        // Never negative, whatever the order.
        assert_eq!(renewed.since(stamp(t0 + s(5), 200)), Duration::ZERO);
    }

    #[test]
    fn the_suspended_time_is_read_from_the_kernel() {
        let a = suspended();
        let b = suspended();
        // It only grows (by a suspend); reading it twice in a row can not go back.
        assert!(b + Duration::from_millis(1) >= a, "{a:?} then {b:?}");
        let boot = read(libc::CLOCK_BOOTTIME);
        assert!(boot > Duration::ZERO && a <= boot, "{a:?} of {boot:?}");
    }
}
