//! The controller's worker, the thin layer around `decide`: a key off the queue, the cache in,
//! actions out through `apply`, the retries and the metrics.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
};

use groundskeeper_plumbing::{
    client::api_error_label,
    life::component::Work,
    logging::klog::KObj,
    watch::cache::{Health, Seen, Shared},
};
use jiff::Timestamp;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use tokio::time::Instant;

use super::{
    apply::{Apply, Notice, Writes, Written},
    cache::{CidrCache, cidr_state},
    conflict::foreign_writes,
    decide::{Action, ReadyCondition, decide},
    index::Blockers,
    metrics::Metrics,
};
use crate::workqueue::WorkQueue;

/// Requeues before a key is dropped (`maxRetries`).
pub const MAX_RETRIES: u32 = 15;
pub const EVENT_STATUS_ERROR: &str = "KubernetesServiceCIDRError";
pub const EVENT_STATUS_ERROR_NOTE: &str = "The ServiceCIDR Status can not be set to Ready=True";
pub const EVENT_DELETION_BLOCKED: &str = "ServiceCIDRDeletionBlocked";
/// How many of our own apply times are remembered per ServiceCIDR for conflict detection.
const OWN_APPLIES_KEPT: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("adding finalizer to ServiceCIDR {name}: {source}")]
    AddFinalizer { name: String, source: kube::Error },
    #[error("removing finalizer from ServiceCIDR {name}: {source}")]
    RemoveFinalizer { name: String, source: kube::Error },
    /// The cached object carries no resourceVersion, so the removal could not be made
    /// conditional on it: not made.
    #[error(
        "not removing finalizer from ServiceCIDR {name}: the cached object has no resourceVersion to make it conditional on"
    )]
    NoResourceVersion { name: String },
    #[error("applying Ready={status} to ServiceCIDR {name}: {source}")]
    ApplyReady {
        name: String,
        status: String,
        source: kube::Error,
    },
}

impl SyncError {
    /// The `error` label of `groundskeeper_servicecidr_sync_errors_total`: what the apiserver
    /// answered (every variant is a failed API call).
    pub fn metric_label(&self) -> &'static str {
        match self {
            SyncError::AddFinalizer { source, .. }
            | SyncError::RemoveFinalizer { source, .. }
            | SyncError::ApplyReady { source, .. } => api_error_label(source),
            SyncError::NoResourceVersion { .. } => "other",
        }
    }
}

pub struct Worker<W> {
    pub cache: Shared<CidrCache>,
    pub queue: WorkQueue<String>,
    apply: Apply<W>,
    pub metrics: Metrics,
    /// Our start, below which managedFields times are history.
    pub started: Timestamp,
    own_applies: Mutex<HashMap<String, Vec<Timestamp>>>,
    /// The resourceVersions our own writes left on each object, the latest last.
    own_versions: Mutex<HashMap<String, Vec<String>>>,
    /// The blockers last reported for each ServiceCIDR whose deletion is blocked.
    reported_blockers: Mutex<HashMap<String, Vec<String>>>,
    reported: Mutex<HashSet<(String, Timestamp)>>,
    blocked: Mutex<HashSet<String>>,
    /// The watches feeding the cache; none in tests that do not care.
    health: Health,
}

/// How soon a finalizer removal held back by a stale cache is checked again.
const STALE_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The event text naming what blocks a deletion.
pub fn blocked_note(name: &str, b: &Blockers) -> String {
    let list: Vec<String> = b
        .found
        .iter()
        .map(|x| match &x.entry.owner {
            Some(o) => format!("{} ({o})", x.entry.name),
            None => x.entry.name.to_string(),
        })
        .collect();
    format!(
        "ServiceCIDR {name} is not deleted while IPAddresses that no other ServiceCIDR contains exist: {}{}",
        list.join(", "),
        if b.more { " and more" } else { "" }
    )
}

impl<W: Writes> Worker<W> {
    pub fn new(
        cache: Shared<CidrCache>,
        queue: WorkQueue<String>,
        writes: W,
        metrics: Metrics,
        dry_run: bool,
        events: groundskeeper_plumbing::events::Events,
    ) -> Self {
        Self {
            cache,
            queue,
            apply: Apply::new(writes, dry_run, events),
            metrics,
            // managedFields times are whole seconds: an entry written in our first second
            // must not look older than us.
            started: Timestamp::from_second(Timestamp::now().as_second())
                .expect("whole seconds of now are a valid timestamp"),
            own_applies: Mutex::default(),
            own_versions: Mutex::default(),
            reported_blockers: Mutex::default(),
            reported: Mutex::default(),
            blocked: Mutex::default(),
            health: Health::default(),
        }
    }

    /// The watches whose health gates the finalizer removal.
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }

    /// One `processNextWorkItem`: false once the queue is shut down.
    pub async fn process_next(&self) -> bool {
        let Some(key) = self.queue.get().await else {
            return false;
        };
        let start = Instant::now();
        let result = self.sync(&key).await;
        let label = if result.is_ok() { "success" } else { "error" };
        self.metrics.reconciles.with_label_values(&[label]).inc();
        self.metrics
            .reconcile_duration
            .with_label_values(&[label])
            .observe(start.elapsed().as_secs_f64());
        match result {
            Ok(()) => self.queue.forget(&key),
            Err(e) => {
                self.metrics
                    .sync_errors
                    .with_label_values(&[e.metric_label()])
                    .inc();
                let n = self.queue.num_requeues(&key);
                if n < MAX_RETRIES {
                    tracing::warn!(servicecidr = KObj::cluster(&key).field(), error = %e, retry = n + 1, "sync failed; retrying with backoff");
                    self.queue.add_rate_limited(key.clone());
                } else {
                    tracing::error!(servicecidr = KObj::cluster(&key).field(), error = %e, retries = n, "sync failed too often; dropping it until its next change");
                    self.metrics.dropped_keys.inc();
                    self.queue.forget(&key);
                }
            }
        }
        self.queue.done(&key);
        true
    }

    /// `sync(key)`.
    pub async fn sync(&self, key: &str) -> Result<(), SyncError> {
        let now = Timestamp::now();
        // Before the read: what is decided on it is only as current as the watches are now.
        let seen = self.health.seen();
        let (obj, actions) = {
            let cache = self.cache.lock();
            let Some(obj) = cache.cidr(key) else {
                drop(cache);
                self.set_blocked(key, false);
                self.own_applies
                    .lock()
                    .expect("own applies lock")
                    .remove(key);
                self.own_versions
                    .lock()
                    .expect("own versions lock")
                    .remove(key);
                return Ok(());
            };
            if self.behind_own_writes(key, &obj) {
                // The cache holds an object one of our own writes produced, not yet the one
                // our latest write did: deciding on it would repeat that write (the Ready
                // apply twice, 3 ms apart). The latest write's own event brings the key back.
                tracing::debug!(
                    servicecidr = KObj::cluster(key).field(),
                    "cache behind our own writes; waiting for their events"
                );
                return Ok(());
            }
            let actions = decide(&cidr_state(&obj), &cache.cidrs, &cache.ips, now);
            (obj, actions)
        };
        self.check_foreign_writes(key, &obj);
        self.set_blocked(
            key,
            actions
                .iter()
                .any(|a| matches!(a, Action::ReportBlocked(_))),
        );
        for action in actions {
            self.carry_out(key, &obj, action, now, &seen).await?;
        }
        Ok(())
    }

    async fn carry_out(
        &self,
        key: &str,
        obj: &ServiceCIDR,
        action: Action,
        now: Timestamp,
        seen: &Seen,
    ) -> Result<(), SyncError> {
        match action {
            Action::AddFinalizer => {
                let written = self.apply.add_finalizer(key).await.map_err(|source| {
                    SyncError::AddFinalizer {
                        name: key.into(),
                        source,
                    }
                })?;
                self.record_write(key, &written);
            }
            Action::ApplyReady(c) => self.apply_ready(key, obj, &c, now).await?,
            Action::ReportBlocked(b) => {
                let ips: Vec<&str> = b.found.iter().map(|x| &*x.entry.name).collect();
                if !self.blockers_changed(key, &ips) {
                    // One report per set of blockers, not one per sync that finds them again.
                    return Ok(());
                }
                tracing::warn!(servicecidr = KObj::cluster(key).field(), blocking_ips = %groundskeeper_plumbing::logging::telemetry::joined(&ips), more = b.more, "deletion blocked: IPAddresses only this ServiceCIDR contains still exist");
                let notice = Notice {
                    warning: true,
                    reason: EVENT_DELETION_BLOCKED.into(),
                    action: "Delete".into(),
                    note: blocked_note(key, &b),
                };
                self.apply.publish(obj, &notice).await;
            }
            Action::RequeueAfter(d) => {
                tracing::debug!(
                    servicecidr = KObj::cluster(key).field(),
                    after_ms = d.as_millis() as u64,
                    "deletion grace period not over; checking again then"
                );
                self.queue.add_after(key.to_string(), d);
            }
            // The removal is the one irreversible write: a stale cache could miss an IPAddress
            // allocated, or hold a covering ServiceCIDR deleted, while a watch was down.
            Action::RemoveFinalizer if self.health.may_act(seen).is_err() => {
                tracing::info!(
                    servicecidr = KObj::cluster(key).field(),
                    "not removing finalizer while a watch is failing or relisting; checking again"
                );
                self.queue.add_after(key.to_string(), STALE_RECHECK);
            }
            // Conditional on the version judged: if the object changed since (a write on a
            // stale view, a deposed leader's late one), the apiserver answers 409, the
            // finalizer stays, and the retry judges the cache's newer view.
            Action::RemoveFinalizer => {
                let Some(rv) = obj.metadata.resource_version.as_deref() else {
                    return Err(SyncError::NoResourceVersion { name: key.into() });
                };
                self.apply
                    .remove_finalizer(key, rv)
                    .await
                    .map_err(|source| SyncError::RemoveFinalizer {
                        name: key.into(),
                        source,
                    })?
            }
        }
        Ok(())
    }

    async fn apply_ready(
        &self,
        key: &str,
        obj: &ServiceCIDR,
        c: &ReadyCondition,
        now: Timestamp,
    ) -> Result<(), SyncError> {
        match self.apply.apply_ready(key, c, now).await {
            Ok(written) => {
                self.record_write(key, &written);
                if let Some(at) = written.applied_at {
                    let mut own = self.own_applies.lock().expect("own applies lock");
                    let times = own.entry(key.to_string()).or_default();
                    times.push(at);
                    if times.len() > OWN_APPLIES_KEPT {
                        times.remove(0);
                    }
                }
                Ok(())
            }
            Err(source) => {
                if c.status == "True" {
                    tracing::error!(servicecidr = KObj::cluster(key).field(), error = %source, "can not set ServiceCIDR status to Ready=True");
                    let notice = Notice {
                        warning: true,
                        reason: EVENT_STATUS_ERROR.into(),
                        action: "UpdateStatus".into(),
                        note: EVENT_STATUS_ERROR_NOTE.into(),
                    };
                    self.apply.publish(obj, &notice).await;
                }
                Err(SyncError::ApplyReady {
                    name: key.into(),
                    status: c.status.clone(),
                    source,
                })
            }
        }
    }

    /// Whether the cached `obj` is the result of one of our own writes but not of the latest.
    fn behind_own_writes(&self, key: &str, obj: &ServiceCIDR) -> bool {
        let Some(rv) = obj.metadata.resource_version.as_deref() else {
            return false;
        };
        let own = self.own_versions.lock().expect("own versions lock");
        own.get(key)
            .is_some_and(|v| v.last().is_some_and(|l| l != rv) && v.iter().any(|w| w == rv))
    }

    fn record_write(&self, key: &str, written: &Written) {
        let Some(rv) = &written.resource_version else {
            return;
        };
        let mut own = self.own_versions.lock().expect("own versions lock");
        let versions = own.entry(key.to_string()).or_default();
        versions.push(rv.clone());
        if versions.len() > OWN_APPLIES_KEPT {
            versions.remove(0);
        }
    }

    /// Whether `ips` differ from the blockers last reported for `key` (and remembers them).
    fn blockers_changed(&self, key: &str, ips: &[&str]) -> bool {
        let mut last = self
            .reported_blockers
            .lock()
            .expect("reported blockers lock");
        let now: Vec<String> = ips.iter().map(|s| s.to_string()).collect();
        if last.get(key) == Some(&now) {
            return false;
        }
        last.insert(key.to_string(), now);
        true
    }

    fn set_blocked(&self, key: &str, blocked: bool) {
        let mut set = self.blocked.lock().expect("blocked lock");
        if blocked {
            set.insert(key.to_string());
        } else {
            set.remove(key);
            self.reported_blockers
                .lock()
                .expect("reported blockers lock")
                .remove(key);
        }
        self.metrics.blocked_deletions.set(set.len() as i64);
    }

    fn check_foreign_writes(&self, key: &str, obj: &ServiceCIDR) {
        let entries = obj.metadata.managed_fields.as_deref().unwrap_or_default();
        if entries.is_empty() {
            return;
        }
        let ours = self
            .own_applies
            .lock()
            .expect("own applies lock")
            .get(key)
            .cloned()
            .unwrap_or_default();
        for w in foreign_writes(entries, &ours, self.started) {
            let fresh = self
                .reported
                .lock()
                .expect("reported lock")
                .insert((key.to_string(), w.at()));
            if !fresh {
                continue;
            }
            self.metrics
                .foreign_writes
                .with_label_values(&[w.kind()])
                .inc();
            self.metrics.conflicting_controller.set(1);
            tracing::warn!(servicecidr = KObj::cluster(key).field(), write = ?w, "another ServiceCIDR controller writes this object (kube-controller-manager's?): run it with --controllers=*,-service-cidr-controller or disable this one");
        }
    }
}

impl<W: Writes> Work for Worker<W> {
    async fn process_next(&self) -> bool {
        Worker::process_next(self).await
    }
}
