//! PodGC's writes behind one trait (`Writes`), and the applier that makes a pass's deletions.
//!
//! A deletion marks the pod Failed (when not already final), then force-deletes it with a UID
//! precondition; many pods at once within an AIMD limit of at most `--gc-concurrency` (see
//! `limit.rs`) and the client's QPS budget. The policy Events go through the same trait.
//! `--dry-run` is decided in one place, `Applier::writes`.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use jiff::Timestamp;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::leader::Fence;

use groundskeeper_plumbing::cache::Shared;

use super::{
    cache::{Caches, SnapshotHealth},
    decide::{Deletion, Sweep, out_of_service_node},
    facts::{DISRUPTION_TARGET, PodFacts},
    limit::{Aimd, RETRY_AFTER_MAX, Signal},
    metrics::Metrics,
    notice::KubeEvents,
    wire::WirePod,
};

pub const DISRUPTION_REASON: &str = "DeletionByPodGC";
pub const DISRUPTION_MESSAGE: &str = "PodGC: node no longer exists";

/// How one pod's force-delete ended.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Deleted,
    /// `--dry-run`: logged, nothing written.
    WouldDelete,
    /// The pod is gone, or a new pod took its name (UID precondition): nothing to do.
    Skipped(Skip),
    /// The status patch failed: the pod was not deleted.
    PatchFailed(String),
    DeleteFailed(String),
    /// 429 Too Many Requests, with the server's Retry-After when it sent one in the body. The
    /// applier waits and retries; as a final outcome it is a failure.
    Throttled(Option<Duration>),
    /// This replica stopped leading before (or while) making the call: nothing more was sent.
    Fenced,
}

/// Attempts per pod while the apiserver answers 429.
const THROTTLED_ATTEMPTS: u32 = 5;

#[derive(Debug, PartialEq, Clone, Copy)]
pub enum Skip {
    Gone,
    Recreated,
    /// Out-of-service pass: the live node cache no longer says not Ready and tainted. Not an
    /// attempt: nothing is sent, nothing counted.
    NodeBack,
}

impl Skip {
    fn as_str(self) -> &'static str {
        match self {
            Skip::Gone => "pod already gone",
            Skip::Recreated => "pod was recreated under the same name (UID precondition)",
            Skip::NodeBack => {
                "its node is Ready again or lost the out-of-service taint since the cycle's snapshot"
            }
        }
    }
}

/// The `pods/<name>/status` strategic merge patch upstream's `markFailedAndDeletePod` sends:
/// phase Failed, observedGeneration, the orphan condition, and `metadata.uid` as precondition.
/// `None` for Succeeded/Failed pods, which are deleted without a patch.
pub fn status_patch(pod: &PodFacts, with_condition: bool, now: Timestamp) -> Option<Value> {
    if pod.phase.is_final() {
        return None;
    }
    let mut status = json!({ "phase": "Failed" });
    if let Some(g) = pod.generation {
        status["observedGeneration"] = json!(g);
    }
    if with_condition {
        // UpdatePodCondition keeps lastTransitionTime when the status does not change.
        let since = match pod.disruption_target_true {
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
        if let Some(g) = pod.generation {
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
    Some(json!({ "metadata": { "uid": &*pod.uid }, "status": status }))
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

/// A 429, and how long the server asked to wait (only when it said so in the Status body).
fn throttled_of(e: &kube::Error) -> Option<Option<Duration>> {
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

/// PodGC's writes to the API. Each answers with the apiserver's error as is: the applier reads
/// skips and 429s off it.
pub trait Writes: Send + Sync {
    /// The `pods/<name>/status` strategic merge patch ([`status_patch`]).
    fn patch_status<'a>(
        &'a self,
        pod: &'a PodFacts,
        patch: Value,
    ) -> BoxFuture<'a, Result<(), kube::Error>>;
    /// The force-delete ([`delete_params`]).
    fn delete<'a>(&'a self, pod: &'a PodFacts) -> BoxFuture<'a, Result<(), kube::Error>>;
    /// A Warning Event on a Namespace.
    fn warn_namespace<'a>(
        &'a self,
        namespace: &'a str,
        note: String,
    ) -> BoxFuture<'a, Result<(), kube::Error>>;
}

/// The writes, made.
pub struct KubeWrites {
    /// Without kube's automatic 429 retry: the limit must see every 429.
    pods: Client,
    events: KubeEvents,
}

impl KubeWrites {
    pub fn new(pods: Client, events: Client) -> Self {
        Self {
            pods,
            events: KubeEvents::new(events),
        }
    }

    fn api(&self, pod: &PodFacts) -> Api<WirePod> {
        Api::namespaced(self.pods.clone(), &pod.namespace)
    }
}

impl Writes for KubeWrites {
    fn patch_status<'a>(
        &'a self,
        pod: &'a PodFacts,
        patch: Value,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async move {
            let pp = PatchParams::default();
            let api = self.api(pod);
            api.patch_status(&pod.name, &pp, &Patch::Strategic(patch))
                .await
                .map(drop)
        })
    }

    fn delete<'a>(&'a self, pod: &'a PodFacts) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async move {
            let api = self.api(pod);
            api.delete(&pod.name, &delete_params(pod)).await.map(drop)
        })
    }

    fn warn_namespace<'a>(
        &'a self,
        namespace: &'a str,
        note: String,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(self.events.warn(namespace, note))
    }
}

/// What a failed write means for the pod.
fn failed(e: kube::Error, other: fn(String) -> Outcome) -> Outcome {
    match (skip_of(&e), throttled_of(&e)) {
        (Some(s), _) => Outcome::Skipped(s),
        (_, Some(after)) => Outcome::Throttled(after),
        _ => other(e.to_string()),
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
    if let Some(patch) = status_patch(&d.pod, d.pass.sets_disruption_target(), now) {
        match fence.guard(writes.patch_status(&d.pod, patch)).await {
            Err(_) => return Outcome::Fenced,
            Ok(Err(e)) => return failed(e, Outcome::PatchFailed),
            Ok(Ok(())) => {}
        }
    }
    match fence.guard(writes.delete(&d.pod)).await {
        Err(_) => Outcome::Fenced,
        Ok(Err(e)) => failed(e, Outcome::DeleteFailed),
        Ok(Ok(())) => Outcome::Deleted,
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
            Outcome::PatchFailed(_) | Outcome::DeleteFailed(_) | Outcome::Throttled(_) => {
                self.failed += 1
            }
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

#[derive(Clone)]
pub struct Applier {
    /// Only through [`Applier::writes`], which decides dry-run.
    pub(super) writes: Arc<dyn Writes>,
    pub metrics: Metrics,
    /// `--gc-concurrency`: the most the limit ever allows.
    pub concurrency: usize,
    pub dry_run: bool,
    /// On shutdown no new deletion starts; those in flight finish.
    pub token: CancellationToken,
    /// Shared by every pass and cycle: the apiserver's load does not reset between them.
    pub limit: Arc<Mutex<Aimd>>,
    /// On leadership loss no new deletion starts and those in flight are dropped.
    pub fence: Fence,
    /// Once a watch the snapshot came from fails or relists, no new deletion starts.
    pub snapshot_health: SnapshotHealth,
    /// The live caches: what a deletion decided on the cycle's snapshot (minutes old by the
    /// out-of-service pass at a low QPS) is checked against right before it starts.
    pub live: Option<Shared<Caches>>,
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
        let limit = Aimd::new(concurrency);
        metrics.concurrency_limit.set(limit.limit());
        Self {
            writes,
            metrics,
            concurrency,
            dry_run,
            token,
            limit: Arc::new(Mutex::new(limit)),
            fence,
            snapshot_health: SnapshotHealth::default(),
            live: None,
        }
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

    /// The one place `--dry-run` is decided: the writes to make, or none.
    fn writes(&self) -> Option<&dyn Writes> {
        (!self.dry_run).then_some(&*self.writes)
    }

    /// A Warning Event on `namespace`; only logged in dry-run, which writes nothing.
    pub async fn warn_namespace(&self, namespace: &str, note: String) {
        let Some(writes) = self.writes() else {
            tracing::info!(namespace, note, "dry-run: would record a Namespace Event");
            return;
        };
        // Fenced like the deletes: a deposed leader writes nothing, Events included.
        match self
            .fence
            .guard(writes.warn_namespace(namespace, note))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(namespace, error = %e, "recording the policy Event failed")
            }
            Err(_) => tracing::info!(namespace, "policy Event not recorded: no longer leading"),
        }
    }

    /// (deletes allowed in flight, when a 429 pause ends)
    fn gate(&self) -> (usize, Option<Instant>) {
        let l = self.limit.lock().expect("podgc limit lock");
        (l.allowed(), l.paused(Instant::now()))
    }

    /// Runs one pass's deletions, as many at a time as the limit allows. A throttled pod goes
    /// back to the front of the queue and through the limit again: retries never pile onto an
    /// apiserver that just said 429.
    pub async fn apply(&self, deletions: Vec<Deletion>) -> Tally {
        let mut tally = Tally::default();
        let mut queue: VecDeque<(Deletion, u32)> = deletions.into_iter().map(|d| (d, 1)).collect();
        let mut in_flight = FuturesUnordered::new();
        loop {
            let mut resume = None;
            while !queue.is_empty() && !self.stopped() {
                let (allowed, paused) = self.gate();
                if paused.is_some() {
                    resume = paused;
                    break;
                }
                if in_flight.len() >= allowed.min(self.concurrency.max(1)) {
                    break;
                }
                let Some((d, attempt)) = queue.pop_front() else {
                    break;
                };
                in_flight.push(async move {
                    let o = self.attempt(&d, attempt).await;
                    (d, attempt, o)
                });
            }
            if in_flight.is_empty() && (queue.is_empty() || self.stopped()) {
                if !queue.is_empty() && !self.snapshot_health.unchanged() {
                    tracing::warn!(
                        not_started = queue.len(),
                        "podgc pass stopped: a pod, node or namespace watch failed or relisted since the cycle's snapshot; the next cycle decides again"
                    );
                }
                break;
            }
            let resumed = async {
                match resume {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((d, attempt, o)) = in_flight.next(), if !in_flight.is_empty() => {
                    if matches!(o, Outcome::Throttled(_)) && attempt < THROTTLED_ATTEMPTS {
                        queue.push_front((d, attempt + 1));
                        continue;
                    }
                    self.count(&d, &o);
                    log(&d, &o);
                    tally.add(&o);
                }
                _ = resumed => {}
                _ = self.token.cancelled(), if in_flight.is_empty() => {}
                _ = self.fence.lost(), if in_flight.is_empty() => {}
            }
        }
        tally
    }

    /// No new deletion starts on shutdown, once this replica no longer leads, or once the
    /// caches the cycle decided on may be stale.
    fn stopped(&self) -> bool {
        self.token.is_cancelled() || !self.fence.is_valid() || !self.snapshot_health.unchanged()
    }

    /// Feeds one answer to the limit.
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
        let mut l = self.limit.lock().expect("podgc limit lock");
        l.observe(signal, Instant::now());
        self.metrics.concurrency_limit.set(l.limit());
    }

    /// One patch-then-delete attempt (`attempt` counts from 1; only 429s are retried).
    async fn attempt(&self, d: &Deletion, attempt: u32) -> Outcome {
        if !self.still_due(d) {
            return Outcome::Skipped(Skip::NodeBack);
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
            self.metrics.deleted(&d.pod.namespace, d.pass);
        }
        let started = Instant::now();
        let o = force_delete(writes, &self.fence, d, Timestamp::now()).await;
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
            Outcome::WouldDelete | Outcome::Fenced | Outcome::Skipped(Skip::NodeBack)
        ) {
            return;
        }
        let ns = &d.pod.namespace;
        // Upstream's counter keeps upstream's meaning: its calls return NotFound (and a UID
        // mismatch) as errors. Ours counts only failures an operator must look at.
        if *o != Outcome::Deleted {
            self.metrics.error(ns, d.pass);
        }
        if matches!(
            o,
            Outcome::PatchFailed(_) | Outcome::DeleteFailed(_) | Outcome::Throttled(_)
        ) {
            self.metrics.failure(ns, d.pass);
        }
        if !d.pass.counts_before_attempt() {
            self.metrics.deleted(ns, d.pass);
        }
        if *o == Outcome::Deleted {
            self.metrics.terminated_deleted(d.pass);
        }
    }
}

fn log(d: &Deletion, o: &Outcome) {
    let pod = format!("{}/{}", d.pod.namespace, d.pod.name);
    let node = d.pod.node();
    let pass = d.pass.name();
    let reason = d.why.as_str();
    match o {
        Outcome::Deleted => {
            tracing::info!(%pod, node, pass, reason, uid = %d.pod.uid, "force-deleted pod")
        }
        Outcome::WouldDelete => {
            tracing::info!(%pod, node, pass, reason, uid = %d.pod.uid, "dry-run: would force-delete pod")
        }
        Outcome::Skipped(s) => {
            tracing::info!(%pod, node, pass, reason, skipped = s.as_str(), "skipped pod")
        }
        Outcome::PatchFailed(e) => tracing::warn!(
            %pod, node, pass, reason, error = %e,
            "marking pod Failed failed; not deleting it"
        ),
        Outcome::DeleteFailed(e) => {
            tracing::warn!(%pod, node, pass, reason, error = %e, "force-deleting pod failed")
        }
        Outcome::Throttled(_) => tracing::warn!(
            %pod, node, pass, reason, attempts = THROTTLED_ATTEMPTS,
            "the apiserver kept answering 429; pod left for the next cycle"
        ),
        Outcome::Fenced => {
            tracing::info!(%pod, node, pass, reason, "not leading any more: pod left alone")
        }
    }
}
