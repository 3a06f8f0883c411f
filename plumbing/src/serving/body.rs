//! Receiving a request body at a bounded cost: within a deadline, at a minimum average rate
//! once its grace is over, with the bodies still arriving after their grace capped, and no
//! larger than the cap. A caller dribbling a body a byte at a time holds its lane for the
//! grace at most, not for the whole deadline.

use std::time::Duration;

use axum::body::{Body, Bytes};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The pace a body must keep.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// The whole body, from the moment it is read.
    pub deadline: Duration,
    /// Any pace for this long.
    pub grace: Duration,
    /// Then at least this many bytes per second on average since the grace.
    pub min_rate: u64,
    /// No more than this many bytes.
    pub max: usize,
}

/// Why a body was not received.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Over the cap (sent without a declared length), or the body broke off.
    TooLargeOrCut,
    /// Not all there by the deadline.
    Timeout,
    /// Below the minimum rate after the grace, or past the grace while the cap of slow bodies
    /// was held by others.
    TooSlow,
}

impl Pace {
    /// When a body that has `got` bytes `since` its start falls below the minimum rate.
    fn due(&self, start: Instant, got: usize) -> Instant {
        let rate = self.min_rate.max(1) as f64;
        let more = Duration::from_secs_f64((got as f64 / rate).min(86_400.0));
        start + self.grace + more
    }
}

/// The body, whole, within `pace`; past the grace it holds one of `slow`'s permits until it is
/// all there (none free: [`Refused::TooSlow`]).
pub async fn receive(body: Body, pace: Pace, slow: &Semaphore) -> Result<Bytes, Refused> {
    let start = Instant::now();
    let end = start + pace.deadline;
    let mut data = body.into_data_stream();
    let mut got: Vec<u8> = Vec::new();
    let mut late = None;
    loop {
        let due = pace.due(start, got.len()).min(end);
        let wake = match late {
            None => (start + pace.grace).min(due),
            Some(_) => due,
        };
        match tokio::time::timeout_at(wake, data.next()).await {
            Ok(None) => return Ok(Bytes::from(got)),
            Ok(Some(Ok(chunk))) => {
                if got.len() + chunk.len() > pace.max {
                    return Err(Refused::TooLargeOrCut);
                }
                got.extend_from_slice(&chunk);
            }
            Ok(Some(Err(_))) => return Err(Refused::TooLargeOrCut),
            Err(_) => {
                let now = Instant::now();
                if now >= end {
                    return Err(Refused::Timeout);
                }
                if now >= due {
                    return Err(Refused::TooSlow);
                }
                if late.is_none() && now >= start + pace.grace {
                    late = Some(slow.try_acquire().map_err(|_| Refused::TooSlow)?);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace() -> Pace {
        Pace {
            deadline: Duration::from_secs(10),
            grace: Duration::from_secs(1),
            min_rate: 100,
            max: 1000,
        }
    }

    /// A body sent in pieces of `piece` bytes every `every`, `total` bytes.
    fn dribbled(total: usize, piece: usize, every: Duration) -> Body {
        let stream = futures::stream::unfold(0usize, move |sent| async move {
            if sent >= total {
                return None;
            }
            tokio::time::sleep(every).await;
            let n = piece.min(total - sent);
            Some((
                Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; n])),
                sent + n,
            ))
        });
        Body::from_stream(stream)
    }

    /// The rule, over generated paces: a body that keeps the rate is received; one that falls
    /// below it after the grace is cut no later than the rate says, however it is dribbled;
    /// none outlives the deadline; a body past its grace with no slow permit free is cut at
    /// the grace.
    #[tokio::test(start_paused = true)]
    async fn a_body_is_cut_when_it_falls_below_the_rate_and_kept_while_it_keeps_it() {
        let slow = Semaphore::new(1);
        // 10 bytes every 50 ms is 200 B/s: kept.
        let r = receive(dribbled(600, 10, Duration::from_millis(50)), pace(), &slow).await;
        assert_eq!(r.map(|b| b.len()), Ok(600));
        for (piece, every_ms) in [(1usize, 100u64), (1, 20), (5, 100), (50, 900)] {
            let start = Instant::now();
            let body = dribbled(1000, piece, Duration::from_millis(every_ms));
            let r = receive(body, pace(), &slow).await;
            let rate = piece as f64 * 1000.0 / every_ms as f64;
            let took = start.elapsed();
            if rate >= 100.0 + 1.0 {
                assert!(r.is_ok(), "{piece} every {every_ms} ms: {r:?}");
            } else {
                assert_eq!(r, Err(Refused::TooSlow), "{piece} every {every_ms} ms");
                // Cut when what it sent fell under grace-free rate: at t with
                // rate*t = min_rate*(t - grace), give or take one piece's wait.
                let cut = 1.0 / (1.0 - rate / 100.0) + every_ms as f64 / 1000.0;
                assert!(
                    took.as_secs_f64() <= cut,
                    "{piece} every {every_ms} ms: {took:?}"
                );
            }
        }
        // No slow permit left: a body still arriving at the grace is cut then.
        let held = slow.try_acquire().unwrap();
        let start = Instant::now();
        let r = receive(dribbled(600, 10, Duration::from_millis(50)), pace(), &slow).await;
        assert_eq!(r, Err(Refused::TooSlow));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        drop(held);
        // The deadline holds whatever the rate.
        let fast_but_long = Pace {
            deadline: Duration::from_secs(2),
            ..pace()
        };
        let r = receive(
            dribbled(1000, 30, Duration::from_millis(100)),
            fast_but_long,
            &slow,
        )
        .await;
        assert_eq!(r, Err(Refused::Timeout));
        let r = receive(Body::from(vec![b'x'; 1001]), pace(), &slow).await;
        assert_eq!(r, Err(Refused::TooLargeOrCut));
        let r = receive(Body::from(vec![b'x'; 1000]), pace(), &slow).await;
        assert_eq!(r.map(|b| b.len()), Ok(1000));
    }
}
