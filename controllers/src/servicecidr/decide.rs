//! One sync of a ServiceCIDR (upstream `sync(key)`) as a pure function.
//!
//! The ServiceCIDR, the indexes and the time in; the actions to take, in order, out.

use std::time::Duration;

use jiff::Timestamp;

use super::index::{Blockers, CidrSet, IpIndex};

pub const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";
pub const CONDITION_READY: &str = "Ready";
pub const REASON_TERMINATING: &str = "Terminating";
pub const MESSAGE_READY: &str = "Kubernetes Service CIDR is ready";
pub const MESSAGE_TERMINATING: &str = "There are still IPAddresses referencing the ServiceCIDR, please remove them or create a new ServiceCIDR";
/// Measured from `metadata.deletionTimestamp`.
pub const DELETION_GRACE: Duration = Duration::from_secs(10);
/// How many blocking IPs the deletion-blocked event names.
pub const BLOCKERS_REPORTED: usize = 10;

/// The parts of a Ready condition upstream compares (lastTransitionTime is not compared).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyCondition {
    pub status: String,
    pub reason: String,
    pub message: String,
}

impl ReadyCondition {
    pub fn ready() -> Self {
        Self {
            status: "True".into(),
            reason: String::new(),
            message: MESSAGE_READY.into(),
        }
    }

    pub fn terminating() -> Self {
        Self {
            status: "False".into(),
            reason: REASON_TERMINATING.into(),
            message: MESSAGE_TERMINATING.into(),
        }
    }
}

/// The ServiceCIDR being synced, as plain values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidrState {
    pub name: String,
    pub has_finalizer: bool,
    pub deletion_timestamp: Option<Timestamp>,
    /// The existing condition of type `Ready`, if any.
    pub ready: Option<ReadyCondition>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    AddFinalizer,
    /// Server-side apply of the Ready condition with lastTransitionTime = now.
    ApplyReady(ReadyCondition),
    /// Log and event naming what keeps the deletion waiting (beyond upstream).
    ReportBlocked(Blockers),
    /// Sync again after exactly this long; no API call now.
    RequeueAfter(Duration),
    RemoveFinalizer,
}

/// `sync(key)` for a ServiceCIDR found in the cache; `cidrs` must contain it.
pub fn decide(cidr: &CidrState, cidrs: &CidrSet, ips: &IpIndex, now: Timestamp) -> Vec<Action> {
    let mut actions = Vec::new();
    let Some(deleted_at) = cidr.deletion_timestamp else {
        if !cidr.has_finalizer {
            actions.push(Action::AddFinalizer);
        }
        apply_if_changed(&mut actions, cidr, ReadyCondition::ready());
        return actions;
    };
    if !cidrs.has_parent(&cidr.name) {
        let blockers = ips.orphans(cidrs, &cidr.name, BLOCKERS_REPORTED);
        if blockers.is_blocked() {
            actions.push(Action::ReportBlocked(blockers));
            apply_if_changed(&mut actions, cidr, ReadyCondition::terminating());
            return actions;
        }
    }
    if let Some(wait) = grace_remaining(deleted_at, now) {
        actions.push(Action::RequeueAfter(wait));
        return actions;
    }
    if cidr.has_finalizer {
        actions.push(Action::RemoveFinalizer);
    }
    actions
}

fn apply_if_changed(actions: &mut Vec<Action>, cidr: &CidrState, want: ReadyCondition) {
    if cidr.ready.as_ref() != Some(&want) {
        actions.push(Action::ApplyReady(want));
    }
}

/// `10s − (now − deletionTimestamp)` when positive, to the nanosecond as Go computes it.
pub fn grace_remaining(deleted_at: Timestamp, now: Timestamp) -> Option<Duration> {
    let elapsed = now.as_nanosecond() - deleted_at.as_nanosecond();
    let remaining = DELETION_GRACE.as_nanos() as i128 - elapsed;
    (remaining > 0).then(|| {
        let n = u64::try_from(remaining).unwrap_or(u64::MAX);
        Duration::from_nanos(n)
    })
}
