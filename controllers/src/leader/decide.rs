//! The election decision, apart from the API: given what this replica has observed of the Lease
//! and its own monotonic clock, what does it do next.
//!
//! Expiry is judged the way client-go judges it: by how long *this* replica has seen the record
//! unchanged, never by the timestamps written in it. Another replica's clock (or a clock step on
//! ours) therefore can not make a live lease look expired.

use std::time::Duration;
use tokio::time::Instant;

use super::clock::Stamp;

/// The parts of a Lease the election reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Empty when nobody holds it (a released lease).
    pub holder: String,
    pub lease_duration: Duration,
    /// Opaque: compared for change, never interpreted as a time.
    pub renew_time: Option<String>,
    pub transitions: i32,
}

/// A record and the local instant at which this replica first saw it in this exact form.
#[derive(Clone, Debug)]
pub struct Observation {
    pub record: Record,
    pub since: Instant,
}

/// Folds a freshly read record into the previous observation.
pub fn observe(prev: Option<Observation>, record: Record, now: Instant) -> Observation {
    match prev {
        Some(p) if p.record == record => p,
        _ => Observation { record, since: now },
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// No Lease object exists: create it holding it.
    Create,
    /// Free or expired: take it over (one more transition).
    Acquire,
    /// Ours: write a new renew time.
    Renew,
    /// Someone else holds a live lease.
    Follow {
        holder: String,
        expires_in: Duration,
    },
}

impl Step {
    /// The step's name for logs.
    pub fn label(&self) -> &'static str {
        match self {
            Step::Create => "create",
            Step::Acquire => "acquire",
            Step::Renew => "renew",
            Step::Follow { .. } => "follow",
        }
    }
}

pub fn decide(identity: &str, observed: Option<&Observation>, now: Instant) -> Step {
    let Some(o) = observed else {
        return Step::Create;
    };
    if o.record.holder.is_empty() {
        return Step::Acquire;
    }
    if o.record.holder == identity {
        return Step::Renew;
    }
    let expires_at = o.since + o.record.lease_duration;
    if now >= expires_at {
        Step::Acquire
    } else {
        Step::Follow {
            holder: o.record.holder.clone(),
            expires_in: expires_at - now,
        }
    }
}

/// A leader that has not renewed within the renew deadline must stop acting: after
/// `lease_duration` (> renew deadline) another replica may take over. Time the machine spent
/// suspended counts: the standbys' clocks did not stop.
pub fn renewal_overdue(last_renewed: Stamp, now: Stamp, renew_deadline: Duration) -> bool {
    now.since(last_renewed) >= renew_deadline
}

/// When the round starting at `now` must have finished. A leader's whole round (read and write)
/// must finish within the renew deadline of its last successful renewal, however long each call
/// takes: client-go bounds the renewal attempt the same way, so a leader can not outlive its
/// term by waiting on a hung request. A candidate's round is bounded by one renew deadline.
pub fn attempt_deadline(
    last_renewed: Option<Stamp>,
    now: Stamp,
    renew_deadline: Duration,
) -> Stamp {
    match last_renewed {
        Some(t) => t.plus(renew_deadline),
        None => now.plus(renew_deadline),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    fn rec(holder: &str, renew: &str) -> Record {
        Record {
            holder: holder.into(),
            lease_duration: LEASE,
            renew_time: Some(renew.into()),
            transitions: 0,
        }
    }

    #[test]
    fn table() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        struct Case {
            name: &'static str,
            observed: Option<Observation>,
            now: Instant,
            want: Step,
        }
        let obs = |holder: &str, since: Instant| {
            Some(Observation {
                record: rec(holder, "2026-01-01T00:00:00.000000Z"),
                since,
            })
        };
        let cases = [
            Case {
                name: "no lease",
                observed: None,
                now: t0,
                want: Step::Create,
            },
            Case {
                name: "released lease",
                observed: obs("", t0),
                now: t0,
                want: Step::Acquire,
            },
            Case {
                name: "held by me",
                observed: obs("me", t0),
                now: t0 + s(100),
                want: Step::Renew,
            },
            Case {
                name: "held by other, fresh",
                observed: obs("other", t0),
                now: t0 + s(5),
                want: Step::Follow {
                    holder: "other".into(),
                    expires_in: s(10),
                },
            },
            Case {
                name: "held by other, just before expiry",
                observed: obs("other", t0),
                now: t0 + s(15) - Duration::from_millis(1),
                want: Step::Follow {
                    holder: "other".into(),
                    expires_in: Duration::from_millis(1),
                },
            },
            Case {
                name: "held by other, expired",
                observed: obs("other", t0),
                now: t0 + s(15),
                want: Step::Acquire,
            },
        ];
        for c in cases {
            assert_eq!(
                decide("me", c.observed.as_ref(), c.now),
                c.want,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn renewal_by_other_restarts_the_expiry_clock() {
        let t0 = Instant::now();
        let o = observe(None, rec("other", "a"), t0);
        // Same record 14 s later: the clock keeps running from t0.
        let o = observe(Some(o), rec("other", "a"), t0 + Duration::from_secs(14));
        assert_eq!(o.since, t0);
        // The holder renewed: a changed record restarts it.
        let o = observe(Some(o), rec("other", "b"), t0 + Duration::from_secs(14));
        assert_eq!(o.since, t0 + Duration::from_secs(14));
        assert!(matches!(
            decide("me", Some(&o), t0 + Duration::from_secs(20)),
            Step::Follow { .. }
        ));
        assert_eq!(
            decide("me", Some(&o), t0 + Duration::from_secs(29)),
            Step::Acquire
        );
    }

    #[test]
    fn timestamps_inside_the_lease_do_not_judge_expiry() {
        // The holder's clock stepped: its renew time went back ten years, then a year forward.
        // Each is just "a change": the lease stays live as long as it keeps changing.
        let t0 = Instant::now();
        let mut o = observe(None, rec("other", "2026-06-01T00:00:00Z"), t0);
        for (i, renew) in ["2016-06-01T00:00:00Z", "2027-06-01T00:00:00Z", "garbage"]
            .iter()
            .enumerate()
        {
            let now = t0 + Duration::from_secs(10 * (i as u64 + 1));
            o = observe(Some(o), rec("other", renew), now);
            assert!(matches!(
                decide("me", Some(&o), now + Duration::from_secs(14)),
                Step::Follow { .. }
            ));
        }
        // A record that never changes expires after lease_duration whatever it says.
        let frozen = observe(None, rec("other", "2099-01-01T00:00:00Z"), t0);
        assert_eq!(decide("me", Some(&frozen), t0 + LEASE), Step::Acquire);
    }

    fn awake(at: Instant) -> Stamp {
        Stamp {
            at,
            asleep: Duration::ZERO,
        }
    }

    #[test]
    fn renew_deadline() {
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        let s = Duration::from_secs;
        assert!(!renewal_overdue(awake(t0), awake(t0 + s(9)), d));
        assert!(renewal_overdue(awake(t0), awake(t0 + d), d));
        // A monotonic clock never goes back, but saturate rather than panic if it looks like it.
        assert!(!renewal_overdue(awake(t0 + d), awake(t0), d));
        // 1 s awake after a 60 s suspend: overdue, though CLOCK_MONOTONIC says 1 s.
        let woke = Stamp {
            at: t0 + s(1),
            asleep: s(60),
        };
        assert!(renewal_overdue(awake(t0), woke, d));
    }

    #[test]
    fn a_round_ends_with_the_term_not_a_fresh_deadline() {
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        let s = Duration::from_secs;
        for (last, now, want) in [
            // Candidate: one renew deadline from the start of the round.
            (None, t0, t0 + d),
            (None, t0 + s(30), t0 + s(40)),
            // Leader: the term of the last renewal, however late the round starts; a round
            // started 8 s into the term has 2 s, not 10.
            (Some(t0), t0 + s(2), t0 + d),
            (Some(t0), t0 + s(8), t0 + d),
            (Some(t0), t0 + s(12), t0 + d),
        ] {
            assert_eq!(
                attempt_deadline(last.map(awake), awake(now), d),
                awake(want),
                "{last:?} {now:?}"
            );
        }
    }
}
