//! client-go's `LeaderElection` Events on the Lease: `<identity> became leader` when this
//! replica acquires it, `<identity> stopped leading` when it hands the Lease over on shutdown,
//! so `kubectl describe lease` and an Event pipeline show every handover as they do
//! kube-controller-manager's.
//!
//! A leader that lost its term (taken over, or not renewed in time) records nothing: it writes
//! nothing once another replica may hold the Lease, and the new leader's `became leader` tells
//! the change (client-go would still try its `stopped leading` then).

use std::time::Duration;

use groundskeeper_plumbing::{
    events::{Events, Notice, Repeat, Reporter, Severity, reporting_controller},
    logging::klog::KObj,
};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ObjectReference};

/// client-go's reason for both Events.
pub const REASON: &str = "LeaderElection";

/// Whose Events these are: the binary's, as client-go's recorder names the component that
/// elects (`groundskeeper.dev/controller-manager`), not one of its controllers.
pub fn reporter() -> Reporter {
    Reporter::in_pod(&reporting_controller("controller-manager"))
}

/// A change of leadership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    BecameLeader,
    StoppedLeading,
}

impl Change {
    fn words(self) -> &'static str {
        match self {
            Change::BecameLeader => "became leader",
            Change::StoppedLeading => "stopped leading",
        }
    }

    fn action(self) -> &'static str {
        match self {
            Change::BecameLeader => "Acquire",
            Change::StoppedLeading => "Release",
        }
    }
}

/// The Event of `identity`'s `change` on the Lease `namespace/name` (its uid when known).
pub fn notice(
    identity: &str,
    change: Change,
    namespace: &str,
    name: &str,
    lease: Option<&Lease>,
) -> Notice {
    Notice {
        severity: Severity::Normal,
        reason: REASON.into(),
        action: change.action().into(),
        note: format!("{identity} {}", change.words()),
        regarding: ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: lease.and_then(|l| l.metadata.uid.clone()),
            ..ObjectReference::default()
        },
        repeat: Repeat::SeriesPerNote,
    }
}

/// Records `n`; a failure is logged and otherwise ignored (an Event never holds up leading),
/// and the write is given up after `within`.
pub async fn record(events: &Events, n: Notice, within: Duration) {
    let failed = match tokio::time::timeout(within, events.publish(&n)).await {
        Ok(Ok(_)) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("not done within {within:?}"),
    };
    let lease = KObj::new(
        n.regarding.namespace.as_deref().unwrap_or_default(),
        n.regarding.name.as_deref().unwrap_or_default(),
    );
    tracing::warn!(lease = lease.field(), note = %n.note, error = %failed, "recording the LeaderElection Event failed");
}
