//! PodGC's writes behind one trait (`Writes`), and the applier that makes a pass's deletions.
//!
//! A deletion marks the pod Failed (when not already final), then force-deletes it with a UID
//! precondition; many pods at once within an AIMD limit of at most `--gc-concurrency` (see
//! `crate::pacing`) and the client's QPS budget. An out-of-service deletion first waits for a
//! live read of its node (`recheck.rs`). What came of each pod is `outcome.rs`'s. `--dry-run`
//! is decided in one place, `Applier::writes`.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::future::BoxFuture;
use jiff::Timestamp;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::leader::Fence;
use crate::pacing::{
    Answer, Halt, Pacer,
    limit::{RETRY_AFTER_MAX, Signal},
    throttled_of,
};

use groundskeeper_plumbing::watch::cache::{Health, Seen, Shared};

pub use super::outcome::{DeleteError, Outcome, Skip, Tally};
use super::{
    cache::Caches,
    decide::{Deletion, Sweep, already_accepted, out_of_service_node},
    facts::{DISRUPTION_TARGET, PodFacts},
    metrics::Metrics,
    outcome::log,
    pending::version,
    recheck::{LiveNode, NodeReads, Recheck},
    wire::WirePod,
};

pub const DISRUPTION_REASON: &str = "DeletionByPodGC";
pub const DISRUPTION_MESSAGE: &str = "PodGC: node no longer exists";

/// The `pods/<name>/status` strategic merge patch upstream's `markFailedAndDeletePod` sends:
/// phase Failed, observedGeneration, the orphan condition, and `metadata.uid` as precondition.
/// `None` for Succeeded/Failed pods, which are deleted without a patch.
pub fn status_patch(pod: &PodFacts, with_condition: bool, now: Timestamp) -> Option<Value> {
    if pod.phase.is_final() {
        return None;
    }
    let mut status = json!({ "phase": "Failed" });
    if let Some(g) = pod.generation.get() {
        status["observedGeneration"] = json!(g);
    }
    if with_condition {
        // UpdatePodCondition keeps lastTransitionTime when the status does not change.
        let since = match pod.disruption_target_true() {
            Some(Some(t)) => t,
            _ => now,
        };
        let mut cond = json!({
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": DISRUPTION_REASON,
            "message": DISRUPTION_MESSAGE,
            "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        });
        if let Some(g) = pod.generation.get() {
            cond["observedGeneration"] = json!(g);
        }
        status["conditions"] = json!([cond]);
        // Upstream's two-way patch lists every condition type in the new order: existing ones
        // where they are (UpdatePodCondition replaces in place), a new DisruptionTarget last.
        // Without it the apiserver's merge puts the patched condition first.
        let mut order: Vec<Value> = pod
            .condition_types
            .iter()
            .map(|t| json!({ "type": &**t }))
            .collect();
        if !pod
            .condition_types
            .iter()
            .any(|t| &**t == DISRUPTION_TARGET)
        {
            order.push(json!({ "type": DISRUPTION_TARGET }));
        }
        status["$setElementOrder/conditions"] = Value::Array(order);
    }
    Some(json!({ "metadata": { "uid": pod.uid.to_string() }, "status": status }))
}

/// Grace period 0 (force) and, beyond upstream, the UID read from the cache as precondition.
pub fn delete_params(pod: &PodFacts) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

/// NotFound: gone. A delete whose UID precondition fails answers 409; a status patch whose
/// `metadata.uid` differs answers 422 "metadata.uid: field is immutable".
fn skip_of(e: &kube::Error) -> Option<Skip> {
    let kube::Error::Api(s) = e else {
        return None;
    };
    let uid_mismatch = || {
        s.details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
    };
    match s.code {
        404 => Some(Skip::Gone),
        409 => Some(Skip::Recreated),
        422 if uid_mismatch() => Some(Skip::Recreated),
        _ => None,
    }
}

/// PodGC's writes to the API. Each answers with the resourceVersion the write left (`None`
/// when the answer carries none: `pending.rs` then waits for the pod to leave the cache), or
/// the apiserver's error as is: the applier reads skips and 429s off it.
pub trait Writes: Send + Sync {
    /// The `pods/<name>/status` strategic merge patch ([`status_patch`]).
    fn patch_status<'a>(
        &'a self,
        pod: &'a PodFacts,
        patch: Value,
    ) -> BoxFuture<'a, Result<Option<u64>, kube::Error>>;
    /// The force-delete ([`delete_params`]).
    fn delete<'a>(&'a self, pod: &'a PodFacts) -> BoxFuture<'a, Result<Option<u64>, kube::Error>>;
}

/// The writes, made.
pub struct KubeWrites {
    /// Without kube's automatic 429 retry: the limit must see every 429.
    pods: Client,
}

impl KubeWrites {
    pub fn new(pods: Client) -> Self {
        Self { pods }
    }

    fn api(&self, pod: &PodFacts) -> Api<WirePod> {
        Api::namespaced(self.pods.clone(), pod.namespace())
    }
}

impl Writes for KubeWrites {
    fn patch_status<'a>(
        &'a self,
        pod: &'a PodFacts,
        patch: Value,
    ) -> BoxFuture<'a, Result<Option<u64>, kube::Error>> {
        Box::pin(async move {
            let pp = PatchParams::default();
            let api = self.api(pod);
            let patched = api
                .patch_status(pod.name(), &pp, &Patch::Strategic(patch))
                .await?;
            Ok(version(patched.metadata.resource_version.as_deref()))
        })
    }

    /// The apiserver answers a pod's delete with the object, at the version of the delete (or
    /// of the update that set its deletionTimestamp, when finalizers hold it).
    fn delete<'a>(&'a self, pod: &'a PodFacts) -> BoxFuture<'a, Result<Option<u64>, kube::Error>> {
        Box::pin(async move {
            let api = self.api(pod);
            let answer = api.delete(pod.name(), &delete_params(pod)).await?;
            Ok(answer
                .left()
                .and_then(|p| version(p.metadata.resource_version.as_deref())))
        })
    }
}

/// What a failed write means for the pod.
fn failed(e: kube::Error, other: fn(&kube::Error) -> DeleteError) -> Outcome {
    match (skip_of(&e), throttled_of(&e)) {
        (Some(s), _) => Outcome::Skipped(s),
        (_, Some(after)) => Outcome::Throttled(after),
        _ => Outcome::Failed(other(&e)),
    }
}

/// Patch-then-delete for one pod. A failed patch means no delete. Each call passes the fence:
/// made only while the lease is valid, dropped in flight when it stops being valid.
pub async fn force_delete(
    writes: &dyn Writes,
    fence: &Fence,
    d: &Deletion,
    now: Timestamp,
) -> Outcome {
    force_delete_answered(writes, fence, d, now).await.0
}

/// [`force_delete`], and what the cache must fold before it judges the pod again: `None` when
/// nothing reached the pod, else the version the last write was answered at (`Some(None)`:
/// until the pod leaves the cache, as after a 404 or a delete answered without the object).
pub async fn force_delete_answered(
    writes: &dyn Writes,
    fence: &Fence,
    d: &Deletion,
    now: Timestamp,
) -> (Outcome, Option<Option<u64>>) {
    // A pod the apiserver says is gone, or is another pod now, is not judged again until the
    // cache says so too.
    let awaited = |o: Outcome, wrote| match o {
        Outcome::Skipped(Skip::Gone | Skip::Recreated) => (o, Some(None)),
        o => (o, wrote),
    };
    let mut wrote = None;
    if let Some(patch) = status_patch(&d.pod, d.pass.sets_disruption_target(), now) {
        match fence.guard(writes.patch_status(&d.pod, patch)).await {
            Err(_) => return (Outcome::Fenced, None),
            Ok(Err(e)) => return awaited(failed(e, DeleteError::patch), None),
            Ok(Ok(v)) => wrote = Some(v),
        }
    }
    if d.pod.force_deleted {
        return (Outcome::Skipped(Skip::ForceDeleteAccepted), wrote);
    }
    match fence.guard(writes.delete(&d.pod)).await {
        // Dropped in flight: the delete may have landed, the patch did.
        Err(_) => (Outcome::Fenced, wrote.map(|_| None)),
        Ok(Err(e)) => awaited(failed(e, DeleteError::delete), wrote),
        Ok(Ok(v)) => (Outcome::Deleted, Some(v)),
    }
}

/// Carries out a pass's deletions. Each of its jobs has its own place: pacing (the AIMD
/// limit and the 429 queue) is [`Pacer`]'s; when no new deletion may start is [`Halt`]'s
/// (shutdown, the fence, the cache health); counting is `count` over [`Metrics`]; dry-run is
/// `Applier::writes`.
#[derive(Clone)]
pub struct Applier {
    /// Only through [`Applier::writes`], which decides dry-run.
    pub(super) writes: Arc<dyn Writes>,
    pub(super) metrics: Metrics,
    pub(super) dry_run: bool,
    /// How many deletions are in flight, and the 429 pauses; shared by every pass and cycle.
    pub(super) pacer: Pacer,
    /// On shutdown no new deletion starts; those in flight finish.
    pub(super) token: CancellationToken,
    /// On leadership loss no new deletion starts and those in flight are dropped.
    pub(super) fence: Fence,
    /// The pod, node and namespace watches: once one fails or relists after `seen`, no new
    /// deletion starts.
    pub(super) health: Health,
    /// The watches' health when the cycle read its snapshot.
    pub(super) seen: Seen,
    /// The live caches: what a deletion decided on the cycle's snapshot (minutes old by the
    /// out-of-service pass at a low QPS) is checked against right before it starts.
    pub(super) live: Option<Shared<Caches>>,
    /// The live node reads of the out-of-service pass (`recheck.rs`); without them that pass
    /// force-deletes nothing.
    pub(super) nodes: Option<Arc<dyn NodeReads>>,
}

impl Answer for Outcome {
    fn throttled(&self) -> bool {
        matches!(self, Outcome::Throttled(_))
    }
}

/// No new deletion starts on shutdown, once this replica no longer leads, or once the caches
/// the cycle decided on may be stale.
impl Halt for Applier {
    fn halted(&self) -> bool {
        self.token.is_cancelled()
            || !self.fence.is_valid()
            || self.health.may_act(&self.seen).is_err()
    }

    fn on_halt(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            tokio::select! {
                _ = self.token.cancelled() => {}
                _ = self.fence.lost() => {}
            }
        })
    }
}

impl Applier {
    pub fn new(
        writes: Arc<dyn Writes>,
        metrics: Metrics,
        concurrency: usize,
        dry_run: bool,
        token: CancellationToken,
        fence: Fence,
    ) -> Self {
        Self {
            writes,
            pacer: Pacer::new(concurrency, metrics.concurrency_limit.clone()),
            metrics,
            dry_run,
            token,
            fence,
            health: Health::default(),
            seen: Seen::default(),
            live: None,
            nodes: None,
        }
    }

    /// The out-of-service pass's live node reads (without them it force-deletes nothing).
    pub fn with_node_reads(mut self, nodes: Arc<dyn NodeReads>) -> Self {
        self.nodes = Some(nodes);
        self
    }

    /// `--gc-concurrency`: the most deletions (or node GETs) in flight.
    pub fn concurrency(&self) -> usize {
        self.pacer.max()
    }

    /// Whether a write of ours to the pod, made since the snapshot (by an earlier pass of this
    /// cycle), is not in the cache yet: the snapshot's view of it is stale.
    fn awaited(&self, d: &Deletion) -> bool {
        self.live
            .as_ref()
            .is_some_and(|live| live.lock().pending.holds(&d.pod))
    }

    /// Whether the live cache still agrees with the snapshot a deletion was decided on. Only
    /// the out-of-service pass depends on state an admin changes by hand to take a node back
    /// (its taint, its readiness): upstream reads its node lister at pass time.
    fn still_due(&self, d: &Deletion) -> bool {
        let (Some(live), Sweep::OutOfService) = (&self.live, d.pass) else {
            return true;
        };
        let caches = live.lock();
        out_of_service_node(d.pod.node_name.as_ref().and_then(|n| caches.nodes.get(n)))
    }

    /// For the out-of-service pass, what the live read of the pod's node says when it does
    /// not confirm the node still out of service (the pod is kept); `None` lets it go. Read
    /// under `--dry-run` too: a read writes nothing, and the dry run then reports what a real
    /// one would delete.
    async fn live_node(&self, d: &Deletion, recheck: &Recheck) -> Option<LiveNode> {
        if d.pass != Sweep::OutOfService {
            return None;
        }
        let live = match &d.pod.node_name {
            Some(node) => recheck.node(self.nodes.as_deref(), node).await,
            None => LiveNode::Unread,
        };
        (live != LiveNode::OutOfService).then_some(live)
    }

    /// The one place `--dry-run` is decided: the writes to make, or none.
    fn writes(&self) -> Option<&dyn Writes> {
        (!self.dry_run).then_some(&*self.writes)
    }

    /// Runs one pass's deletions through the pacer; those that would change nothing
    /// ([`already_accepted`]) are counted as skipped and never reach it.
    pub async fn apply(&self, deletions: Vec<Deletion>) -> Tally {
        let mut tally = Tally::default();
        let (held, deletions): (Vec<Deletion>, Vec<Deletion>) =
            deletions.into_iter().partition(already_accepted);
        if let Some(first) = held.first() {
            tally.skipped += held.len();
            self.metrics.force_delete_skipped(first.pass, held.len());
            let (pass, pods) = (first.pass.name(), held.len());
            tracing::debug!(pass, pods, "not force-deleting pods finalizers hold again");
        }
        // The out-of-service pass's node reads, once per node for the whole pass.
        let recheck = Recheck::default();
        let recheck = &recheck;
        let not_started = self
            .pacer
            .run(
                deletions,
                self,
                |d, attempt| async move {
                    let o = self.attempt(&d, attempt, recheck).await;
                    (d, o)
                },
                |d, o| {
                    self.count(&d, &o);
                    log(&d, &o);
                    tally.add(&o);
                },
            )
            .await;
        if not_started > 0 && self.health.may_act(&self.seen).is_err() {
            tracing::warn!(
                not_started,
                "podgc pass stopped: a pod, node or namespace watch failed or relisted since the cycle's snapshot; the next cycle decides again"
            );
        }
        tally
    }

    /// Feeds one answer to the pacer, counting the 429s.
    fn observe(&self, o: &Outcome, took: Duration) {
        let signal = match o {
            Outcome::Throttled(after) => {
                self.metrics.throttled.inc();
                if let Some(asked) = after.filter(|a| *a > RETRY_AFTER_MAX) {
                    self.metrics.retry_after_capped.inc();
                    tracing::warn!(retry_after = ?asked, pausing = ?RETRY_AFTER_MAX, "429 with a Retry-After longer than PodGC waits; pausing new deletes for the cap instead");
                }
                Signal::Throttled(*after)
            }
            _ => Signal::Answered(took),
        };
        self.pacer.observe(signal);
    }

    /// One patch-then-delete attempt (`attempt` counts from 1; only 429s are retried).
    async fn attempt(&self, d: &Deletion, attempt: u32, recheck: &Recheck) -> Outcome {
        if self.awaited(d) {
            return Outcome::Skipped(Skip::Pending);
        }
        if !self.still_due(d) {
            return Outcome::Skipped(Skip::NodeBack);
        }
        if let Some(live) = self.live_node(d, recheck).await {
            return Outcome::Skipped(Skip::NodeLive(live));
        }
        let Some(writes) = self.writes() else {
            return Outcome::WouldDelete;
        };
        // Checked before counting, so a deposed leader's skipped pods are not counted as
        // deleted; force_delete checks again right before each call.
        if !self.fence.is_valid() {
            return Outcome::Fenced;
        }
        if attempt == 1 && d.pass.counts_before_attempt() {
            self.metrics.deleted(d.pod.namespace(), d.pass);
        }
        let started = Instant::now();
        let (o, wrote) = force_delete_answered(writes, &self.fence, d, Timestamp::now()).await;
        if let (Some(version), Some(live)) = (wrote, &self.live) {
            live.lock().wrote(&d.pod, version);
        }
        // Refused or abandoned by us, not an answer of the apiserver's.
        if o != Outcome::Fenced {
            self.observe(&o, started.elapsed());
        }
        o
    }

    /// Counts a pod's final outcome (dry-run counts nothing).
    fn count(&self, d: &Deletion, o: &Outcome) {
        // Dry-run, fenced and reconsidered pods were never attempted: neither errors nor
        // deletions.
        if matches!(
            o,
            Outcome::WouldDelete
                | Outcome::Fenced
                | Outcome::Skipped(
                    Skip::NodeBack | Skip::ForceDeleteAccepted | Skip::NodeLive(_) | Skip::Pending
                )
        ) {
            match o {
                Outcome::Skipped(Skip::ForceDeleteAccepted) => {
                    self.metrics.force_delete_skipped(d.pass, 1)
                }
                Outcome::Skipped(Skip::NodeLive(live)) => {
                    self.metrics.out_of_service_kept(live.label())
                }
                _ => {}
            }
            return;
        }
        let ns = d.pod.namespace();
        // Upstream's counter keeps upstream's meaning: its calls return NotFound (and a UID
        // mismatch) as errors. Ours counts only failures an operator must look at.
        if *o != Outcome::Deleted {
            self.metrics.error(ns, d.pass);
        }
        let failed = match o {
            Outcome::Failed(e) => Some(e),
            Outcome::Throttled(_) => Some(&DeleteError::Throttled),
            _ => None,
        };
        if let Some(e) = failed {
            self.metrics.failure(ns, d.pass, e.metric_label());
        }
        if !d.pass.counts_before_attempt() {
            self.metrics.deleted(ns, d.pass);
        }
        if *o == Outcome::Deleted {
            self.metrics.terminated_deleted(d.pass);
        }
    }
}
