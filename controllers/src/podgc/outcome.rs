//! How one pod's force delete ended (`Outcome`, and why: `Skip`, `DeleteError`), what a pass
//! did (`Tally`, the cycle summary's counts), and the one log line per pod.

use std::time::Duration;

use groundskeeper_plumbing::{client::api_error_label, logging::klog::KObj};

use crate::pacing::THROTTLED_ATTEMPTS;

use super::{decide::Deletion, recheck::LiveNode};

/// How one pod's force-delete ended.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Deleted,
    /// `--dry-run`: logged, nothing written.
    WouldDelete,
    /// The pod is gone, or a new pod took its name (UID precondition): nothing to do.
    Skipped(Skip),
    /// The status patch or the delete failed (a failed patch means no delete).
    Failed(DeleteError),
    /// 429 Too Many Requests, with the server's Retry-After when it sent one in the body. The
    /// applier waits and retries; as a final outcome it is a failure.
    Throttled(Option<Duration>),
    /// This replica stopped leading before (or while) making the call: nothing more was sent.
    Fenced,
}

/// Why a force-delete failed: the pod stays for the next cycle. Carries the apiserver's
/// answer as text and as its metric label (`kube::Error` itself cannot be compared).
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum DeleteError {
    /// The status patch failed: the pod was not deleted.
    #[error("marking the pod Failed: {message}")]
    Patch {
        label: &'static str,
        message: String,
    },
    #[error("force-deleting the pod: {message}")]
    Delete {
        label: &'static str,
        message: String,
    },
    /// 429 to every attempt (a final [`Outcome::Throttled`]).
    #[error("the apiserver kept answering 429 Too Many Requests")]
    Throttled,
}

impl DeleteError {
    /// The `error` label of `groundskeeper_podgc_delete_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            DeleteError::Patch { label, .. } | DeleteError::Delete { label, .. } => label,
            DeleteError::Throttled => "too_many_requests",
        }
    }

    pub(super) fn patch(e: &kube::Error) -> Self {
        DeleteError::Patch {
            label: api_error_label(e),
            message: e.to_string(),
        }
    }

    pub(super) fn delete(e: &kube::Error) -> Self {
        DeleteError::Delete {
            label: api_error_label(e),
            message: e.to_string(),
        }
    }
}

#[derive(Debug, PartialEq, Clone, Copy)]
pub enum Skip {
    Gone,
    Recreated,
    /// Out-of-service pass: the live node cache no longer says not Ready and tainted. Not an
    /// attempt: nothing is sent, nothing counted.
    NodeBack,
    /// Force delete already accepted (finalizers hold it): patched if needed, no DELETE sent.
    ForceDeleteAccepted,
    /// Out-of-service pass: the live read of the node (`recheck.rs`) did not find it still out
    /// of service. Not an attempt either: nothing sent, the pod judged again next cycle.
    NodeLive(LiveNode),
    /// An earlier pass of this cycle wrote to the pod and the cache has not folded that write
    /// yet (`pending.rs`): not judged again on the older view. Not an attempt.
    Pending,
}

impl Skip {
    fn as_str(self) -> &'static str {
        match self {
            Skip::Gone => "pod already gone",
            Skip::Recreated => "pod was recreated under the same name (UID precondition)",
            Skip::NodeBack => {
                "its node is Ready again or lost the out-of-service taint since the cycle's snapshot"
            }
            Skip::ForceDeleteAccepted => {
                "its force delete was already accepted; finalizers hold it"
            }
            Skip::NodeLive(live) => live.as_str(),
            Skip::Pending => {
                "written by an earlier pass of this cycle; not judged again until the cache has that write"
            }
        }
    }
}

/// What one pass did, for the cycle summary.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub deleted: usize,
    pub would_delete: usize,
    pub skipped: usize,
    pub failed: usize,
    /// Not attempted (or abandoned in flight) because leadership ended.
    pub fenced: usize,
}

impl Tally {
    pub fn add(&mut self, o: &Outcome) {
        match o {
            Outcome::Deleted => self.deleted += 1,
            Outcome::WouldDelete => self.would_delete += 1,
            Outcome::Skipped(_) => self.skipped += 1,
            Outcome::Failed(_) | Outcome::Throttled(_) => self.failed += 1,
            Outcome::Fenced => self.fenced += 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Tally::default()
    }

    /// Every pod the pass chose, whatever came of it.
    pub fn chosen(&self) -> usize {
        self.deleted + self.would_delete + self.skipped + self.failed + self.fenced
    }
}

impl<'a> std::iter::Sum<&'a Tally> for Tally {
    fn sum<I: Iterator<Item = &'a Tally>>(iter: I) -> Tally {
        iter.fold(Tally::default(), |a, t| Tally {
            deleted: a.deleted + t.deleted,
            would_delete: a.would_delete + t.would_delete,
            skipped: a.skipped + t.skipped,
            failed: a.failed + t.failed,
            fenced: a.fenced + t.fenced,
        })
    }
}

/// `deleted=1 would_delete=0 skipped=0 failed=0 fenced=0`, as the cycle summary logs it.
impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Tally {
            deleted,
            would_delete,
            skipped,
            failed,
            fenced,
        } = self;
        write!(
            f,
            "deleted={deleted} would_delete={would_delete} skipped={skipped} failed={failed} fenced={fenced}"
        )
    }
}

/// The pod's line: what came of it, with its pass and why it was chosen.
pub fn log(d: &Deletion, o: &Outcome) {
    let pod = KObj::new(d.pod.key.namespace(), d.pod.key.name());
    let pod = pod.field();
    let node = KObj::cluster(d.pod.node());
    let node = node.field();
    let pass = d.pass.name();
    let reason = d.why.as_str();
    match o {
        Outcome::Deleted => {
            tracing::info!(pod, node, pass, reason, uid = %d.pod.uid, "force-deleted pod")
        }
        Outcome::WouldDelete => {
            tracing::info!(pod, node, pass, reason, uid = %d.pod.uid, "dry-run: would force-delete pod")
        }
        Outcome::Skipped(s) => {
            tracing::info!(pod, node, pass, reason, skipped = s.as_str(), "skipped pod")
        }
        Outcome::Failed(e @ DeleteError::Patch { .. }) => tracing::warn!(
            pod, node, pass, reason, error = %e,
            "marking pod Failed failed; not deleting it"
        ),
        Outcome::Failed(e) => {
            tracing::warn!(pod, node, pass, reason, error = %e, "force-deleting pod failed")
        }
        Outcome::Throttled(_) => tracing::warn!(
            pod,
            node,
            pass,
            reason,
            attempts = THROTTLED_ATTEMPTS,
            "the apiserver kept answering 429; pod left for the next cycle"
        ),
        Outcome::Fenced => {
            tracing::info!(
                pod,
                node,
                pass,
                reason,
                "not leading any more: pod left alone"
            )
        }
    }
}
