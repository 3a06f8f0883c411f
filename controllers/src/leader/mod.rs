//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's timings and rules:
//! writes carry the resourceVersion read, expiry is judged by local time, a leader that can not
//! renew within the renew deadline stops, and a leader that is shut down releases the lease.

pub mod clock;
pub mod decide;
pub mod events;
pub mod fence;
pub mod metrics;

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{Api, api::PostParams};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

pub use clock::Stamp;
use decide::{Observation, Record, Step, attempt_deadline, decide, observe, renewal_overdue};
use events::Change;
pub use fence::{Fence, Fenced, Term};
use groundskeeper_plumbing::events::{Events, Notice};
pub use metrics::LeaderMetrics;

#[derive(Clone, Debug)]
pub struct ElectionConfig {
    pub lease_name: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("leadership lost: lease {lease} not renewed within {deadline:?}")]
    RenewDeadline { lease: String, deadline: Duration },
    #[error("leadership lost: lease {lease} is now held by {holder}")]
    TakenOver { lease: String, holder: String },
}

/// The gate reconcilers wait on: caches fill on every replica (so a standby is warm and ready),
/// but only the leader acts. Every write additionally passes the [`Fence`] it hands out.
#[derive(Clone)]
pub struct Leadership(Fence);

impl Leadership {
    /// A gate that is open from the start, for `--leader-elect=false`.
    pub fn always() -> Self {
        Self(Fence::unbounded())
    }

    pub fn is_leading(&self) -> bool {
        self.0.is_valid()
    }

    /// The fence the write layers take.
    pub fn fence(&self) -> Fence {
        self.0.clone()
    }

    /// Resolves once this replica leads; never resolves if it never does.
    pub async fn acquired(&self) {
        let mut rx = self.0.watch();
        if rx.wait_for(|t| *t != Term::Standby).await.is_err() {
            std::future::pending::<()>().await
        }
    }
}

pub struct Elector {
    api: Api<Lease>,
    cfg: ElectionConfig,
    is_leader: LeaderMetrics,
    tx: watch::Sender<Term>,
    /// Where the `LeaderElection` Events go ([`Elector::recording`]); none by default.
    events: Option<Events>,
}

/// What one round's read-decide-write came to.
struct Round {
    step: Option<Step>,
    write: Option<Result<Lease, WriteFailed>>,
}

/// Why a Lease write failed, and whether it was only a lost race (see [`lost_race`]).
struct WriteFailed {
    text: String,
    lost_race: bool,
}

impl From<&str> for WriteFailed {
    fn from(text: &str) -> Self {
        Self {
            text: text.into(),
            lost_race: false,
        }
    }
}

impl From<kube::Error> for WriteFailed {
    fn from(e: kube::Error) -> Self {
        Self {
            lost_race: lost_race(&e),
            text: e.to_string(),
        }
    }
}

impl Elector {
    /// `client` should be the elector's own (see `KubeArgs::lease_client`): lease calls must
    /// not wait behind the controllers' QPS budget or their connections.
    pub fn new(
        client: kube::Client,
        cfg: ElectionConfig,
        is_leader: LeaderMetrics,
    ) -> (Self, Leadership) {
        let (tx, rx) = watch::channel(Term::Standby);
        let api = Api::namespaced(client, &cfg.namespace);
        (
            Self {
                api,
                cfg,
                is_leader,
                tx,
                events: None,
            },
            Leadership(Fence::new(rx)),
        )
    }

    /// Records client-go's `LeaderElection` Events on the Lease through `events`: this
    /// replica's identity `became leader`, and `stopped leading` when it hands the Lease over
    /// on shutdown (see [`events`]).
    pub fn recording(mut self, events: Events) -> Self {
        self.events = Some(events);
        self
    }

    fn notice(&self, change: Change, lease: Option<&Lease>) -> Notice {
        let c = &self.cfg;
        events::notice(&c.identity, change, &c.namespace, &c.lease_name, lease)
    }

    /// `<identity> became leader`, fenced as the controllers' writes are (not written once
    /// this term ends) and not waited for: the first renewal is due.
    fn announce_acquired(&self, lease: &Lease) {
        let Some(events) = &self.events else { return };
        let fence = Fence::new(self.tx.subscribe());
        let events = events.clone().fenced(std::sync::Arc::new(fence));
        let (n, within) = (
            self.notice(Change::BecameLeader, Some(lease)),
            self.cfg.renew_deadline,
        );
        tokio::spawn(async move { events::record(&events, n, within).await });
    }

    /// `<identity> stopped leading`, before the release while the Lease is still ours: given
    /// up after a retry period, and when the term ends (`term_left`).
    async fn announce_released(&self, lease: Option<&Lease>, term_left: Duration) {
        let Some(events) = &self.events else { return };
        let n = self.notice(Change::StoppedLeading, lease);
        events::record(events, n, self.cfg.retry_period.min(term_left)).await;
    }

    /// Campaigns and renews until `token` is cancelled (then releases the lease if held and
    /// returns Ok) or leadership is lost (Err: the caller stops every reconciler and exits).
    ///
    /// While leading, every await is raced against `last renewal + renew deadline`: a hung read
    /// or write can not extend leadership. The fences judge the same instant on their own.
    pub async fn run(self, token: CancellationToken) -> Result<(), LeaderError> {
        let c = &self.cfg;
        let mut observed: Option<Observation> = None;
        let mut current: Option<Lease> = None;
        // When the last successful renewal (or acquisition) started: before its read, so never
        // later than when the apiserver recorded it and others began timing it.
        let mut last_renewed: Option<Stamp> = None;
        tracing::info!(lease = %c.lease_name, namespace = %c.namespace, identity = %c.identity, "campaigning for leadership");
        loop {
            if token.is_cancelled() {
                // The fence closes (and the leader gauge drops) before the Lease is freed: once
                // another replica can take it, nothing of ours may still pass.
                self.set_term(Term::Standby);
                // A lease past its term is left alone: it may already be someone else's.
                if let Some(t) = last_renewed
                    && !renewal_overdue(t, Stamp::now(), c.renew_deadline)
                {
                    // Recorded while the Lease is still ours, and given up when its term ends:
                    // nothing of ours is written once another replica may hold it.
                    let left = c.renew_deadline.saturating_sub(Stamp::now().since(t));
                    self.announce_released(current.as_ref(), left).await;
                    self.release(current).await;
                }
                return Ok(());
            }
            let now = Stamp::now();
            if let Some(t) = last_renewed
                && renewal_overdue(t, now, c.renew_deadline)
            {
                return Err(self.give_up(t));
            }
            let deadline = attempt_deadline(last_renewed, now, c.renew_deadline);
            let round = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline.wake_instant()) => None,
                // SIGTERM does not wait for a hung round: released (or not) at the top.
                _ = token.cancelled() => continue,
                r = self.round(observed.clone(), current.clone(), deadline) => Some(r),
            };
            let Some((round, seen, lease)) = round else {
                tracing::warn!(lease = %c.lease_name, deadline = ?c.renew_deadline, "lease read/write did not finish before the deadline");
                continue;
            };
            observed = seen;
            current = lease;
            match (&round.step, round.write) {
                (Some(Step::Follow { holder, .. }), _) if last_renewed.is_some() => {
                    self.set_term(Term::Standby);
                    tracing::error!(lease = %c.lease_name, %holder, "stopped acting: the lease is held by another replica");
                    return Err(LeaderError::TakenOver {
                        lease: c.lease_name.clone(),
                        holder: holder.clone(),
                    });
                }
                (Some(Step::Follow { holder, expires_in }), _) => {
                    tracing::debug!(%holder, expires_in_seconds = expires_in.as_secs_f64(), "following");
                }
                (_, Some(Ok(lease))) => {
                    let acquired = last_renewed.is_none();
                    last_renewed = Some(now);
                    self.set_term(Term::Until(now.plus(c.renew_deadline)));
                    if acquired {
                        tracing::info!(lease = %c.lease_name, identity = %c.identity, "became leader");
                        self.announce_acquired(&lease);
                    }
                    observed = Some(observe(observed, record_of(&lease), now.at));
                    current = Some(lease);
                }
                (step, Some(Err(e))) => {
                    let step = step.as_ref().map_or("none", Step::label);
                    if e.lost_race {
                        // Another replica created or took the Lease between our read and our
                        // write: the ordinary outcome of a race at start-up or takeover.
                        tracing::debug!(lease = %c.lease_name, step, error = %e.text, "another replica wrote the lease first")
                    } else {
                        tracing::warn!(lease = %c.lease_name, step, error = %e.text, "writing the lease failed")
                    }
                }
                // A read error left no object to write against; try again next round.
                (_, None) => {}
            }
            // A follower judges expiry from when it first saw the holder's last renewal, so
            // the longer it takes to notice a renewal, the later it takes over after a crash.
            // It therefore reads the Lease every half retry period (a cheap GET) and wakes
            // exactly at expiry: takeover is within lease duration + retry/2 (16 s with the
            // defaults), where client-go's worst case is lease + 2 × retry.
            let pause = match &round.step {
                Some(Step::Follow { expires_in, .. }) if last_renewed.is_none() => {
                    (*expires_in).min(c.retry_period / 2)
                }
                _ => c.retry_period,
            };
            // A leader whose term ends during the pause wakes then, and gives up at the top.
            let term_end = last_renewed.map(|t| t.plus(c.renew_deadline).wake_instant());
            tokio::select! {
                _ = token.cancelled() => {}
                _ = tokio::time::sleep(pause) => {}
                _ = tokio::time::sleep_until(term_end.unwrap_or(deadline.wake_instant())), if term_end.is_some() => {}
            }
        }
    }

    /// Read, decide, write. Returns the round and the observation/lease to carry over.
    async fn round(
        &self,
        mut observed: Option<Observation>,
        mut current: Option<Lease>,
        deadline: Stamp,
    ) -> (Round, Option<Observation>, Option<Lease>) {
        let c = &self.cfg;
        let read = self.api.get_opt(&c.lease_name).await;
        // A follower times the holder's term from when it saw the record: when the answer
        // arrived, not when it was asked for (client-go records observedTime after the Get).
        // A GET held for seconds may answer with a renewal made at its very end; timed from
        // the ask, the standby would take over that much before the holder's term ends.
        // (A leader's term is timed the other way, from the round's start in `run`: never
        // later than when the apiserver recorded the renewal.)
        let seen_at = Instant::now();
        match read {
            Ok(Some(lease)) => {
                observed = Some(observe(observed, record_of(&lease), seen_at));
                current = Some(lease);
            }
            Ok(None) => {
                observed = None;
                current = None;
            }
            Err(e) => {
                tracing::warn!(lease = %c.lease_name, error = %e, "reading the lease failed");
                let round = Round {
                    step: None,
                    write: None,
                };
                return (round, observed, current);
            }
        }
        let step = decide(&c.identity, observed.as_ref(), seen_at);
        // Checked on the clock, not only by the racing timer: after a process stop the timer
        // may not have fired yet when this runs again.
        if Stamp::now().reached(deadline) {
            let round = Round {
                step: Some(step),
                write: Some(Err("deadline passed before the write".into())),
            };
            return (round, observed, current);
        }
        let pp = PostParams::default();
        let write = match (&step, &current) {
            (Step::Create, _) => Some(self.api.create(&pp, &self.fresh_lease()).await),
            (Step::Acquire, Some(l)) => {
                Some(self.api.replace(&c.lease_name, &pp, &self.taken(l)).await)
            }
            (Step::Renew, Some(l)) => {
                Some(self.api.replace(&c.lease_name, &pp, &self.renewed(l)).await)
            }
            _ => None,
        };
        let round = Round {
            step: Some(step),
            write: write.map(|w| w.map_err(WriteFailed::from)),
        };
        (round, observed, current)
    }

    /// Stop acting first (the fences close, in-flight writes are dropped), then report the loss
    /// so the caller drains and exits.
    fn give_up(&self, last_renewed: Stamp) -> LeaderError {
        self.set_term(Term::Standby);
        let since = Stamp::now().since(last_renewed);
        tracing::error!(
            lease = %self.cfg.lease_name,
            since_last_renewal_ms = since.as_millis() as u64,
            renew_deadline_ms = self.cfg.renew_deadline.as_millis() as u64,
            "stopped acting: lease not renewed within the renew deadline"
        );
        LeaderError::RenewDeadline {
            lease: self.cfg.lease_name.clone(),
            deadline: self.cfg.renew_deadline,
        }
    }

    fn set_term(&self, term: Term) {
        self.is_leader.set(term.valid_at(Stamp::now()));
        self.tx.send_replace(term);
    }

    /// Bounds a call by the renew deadline (the release on shutdown).
    async fn call<T>(&self, fut: impl Future<Output = kube::Result<T>>) -> Result<T, String> {
        match tokio::time::timeout(self.cfg.renew_deadline, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("timed out after {:?}", self.cfg.renew_deadline)),
        }
    }

    fn spec(&self, acquire: MicroTime, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(lease_duration_seconds(self.cfg.lease_duration)),
            acquire_time: Some(acquire),
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    fn fresh_lease(&self) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.cfg.lease_name.clone()),
                namespace: Some(self.cfg.namespace.clone()),
                ..Default::default()
            },
            spec: Some(self.spec(MicroTime(Timestamp::now()), 0)),
        }
    }

    fn taken(&self, current: &Lease) -> Lease {
        let transitions = current
            .spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0);
        Lease {
            metadata: current.metadata.clone(),
            spec: Some(self.spec(MicroTime(Timestamp::now()), transitions + 1)),
        }
    }

    fn renewed(&self, current: &Lease) -> Lease {
        let spec = current.spec.clone().unwrap_or_default();
        let acquire = spec
            .acquire_time
            .clone()
            .unwrap_or(MicroTime(Timestamp::now()));
        Lease {
            metadata: current.metadata.clone(),
            spec: Some(self.spec(acquire, spec.lease_transitions.unwrap_or(0))),
        }
    }

    /// Gives the lease up so a standby takes over at its next retry instead of waiting out the
    /// lease duration (client-go's ReleaseOnCancel).
    async fn release(&self, current: Option<Lease>) {
        let Some(current) = current else { return };
        let mut lease = current;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        }
        match self
            .call(
                self.api
                    .replace(&self.cfg.lease_name, &PostParams::default(), &lease),
            )
            .await
        {
            Ok(_) => tracing::info!(lease = %self.cfg.lease_name, "released leadership"),
            Err(e) => {
                tracing::warn!(lease = %self.cfg.lease_name, error = %e, "releasing the lease failed; a standby takes over when it expires")
            }
        }
    }
}

/// The parts of a Lease the election (and the uninstall hook) judges.
pub fn record_of(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    Record {
        holder: spec.holder_identity.unwrap_or_default(),
        lease_duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64),
        renew_time: spec.renew_time.map(|t| t.0.to_string()),
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}

/// The Lease's `leaseDurationSeconds` for `d`: rounded up, never down. Standbys wait this
/// long after a renewal, so a value rounded down (10.9 s written as 10) would eat into the
/// margin between the leader's renew deadline and their takeover, or reverse it.
pub fn lease_duration_seconds(d: Duration) -> i32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX).max(1)
}

/// `<pod name>_<random suffix>`: unique even when a pod restarts under the same name.
pub fn identity(pod_name: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    let suffix = RandomState::new().hash_one((std::process::id(), Instant::now())) as u32;
    format!("{pod_name}_{suffix:08x}")
}

#[cfg(test)]
mod elector_tests;

/// A Lease write refused because another replica wrote first: 409 (AlreadyExists on create,
/// Conflict on a stale resourceVersion).
fn lost_race(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod race_tests {
    use super::lost_race;

    fn status(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("x", reason)
                .with_code(code)
                .boxed(),
        )
    }

    /// A standby that loses the create race at start-up logs it at debug, not as a failure.
    #[test]
    fn only_a_409_is_a_lost_race() {
        assert!(lost_race(&status(409, "AlreadyExists")));
        assert!(lost_race(&status(409, "Conflict")));
        for (code, reason) in [
            (403, "Forbidden"),
            (500, "InternalError"),
            (429, "TooManyRequests"),
        ] {
            assert!(!lost_race(&status(code, reason)), "{code}");
        }
    }
}
