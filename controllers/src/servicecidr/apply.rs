//! Every write the controller makes to the API, and the one place `--dry-run` is decided.
//!
//! The writes sit behind the `Writes` trait, so the worker is tested against a recording
//! fake; `Apply` makes them, or under `--dry-run` only logs `dry-run: would …`. Events go
//! through plumbing's Event writer, which decides dry-run and passes the fence for them.

use std::{fmt, future::Future};

use groundskeeper_plumbing::{
    events::{self, Events, Repeat, Severity},
    logging::klog::KObj,
};
use jiff::Timestamp;
use k8s_openapi::{api::networking::v1::ServiceCIDR, apimachinery::pkg::apis::meta::v1::Time};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::leader::Fence;

use super::{
    conflict::{FIELD_MANAGER, PATCH_FIELD_MANAGER, our_apply_time},
    decide::{CONDITION_READY, FINALIZER, ReadyCondition},
};

/// An event to record on a ServiceCIDR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub warning: bool,
    pub reason: String,
    pub action: String,
    pub note: String,
}

/// What one of our writes left on the server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// The object's resourceVersion after the write (None: gone, dry-run, or not reported).
    pub resource_version: Option<String>,
    /// The time the apiserver recorded for a status apply of ours.
    pub applied_at: Option<Timestamp>,
}

pub trait Writes: Send + Sync + 'static {
    /// Merge-appends our finalizer; NotFound is success (the object is gone).
    fn add_finalizer(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Written, kube::Error>> + Send;
    /// Deletes our finalizer from the list, only if the object is still at `resource_version`
    /// (the version the removal was decided on): a changed object answers 409 Conflict and
    /// keeps its finalizer. NotFound is success.
    fn remove_finalizer(
        &self,
        name: &str,
        resource_version: &str,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Server-side applies the Ready condition on the status subresource.
    fn apply_ready(
        &self,
        name: &str,
        condition: &ReadyCondition,
        now: Timestamp,
    ) -> impl Future<Output = Result<Written, kube::Error>> + Send;
}

/// The writes as the worker makes them: through `W`, or only logged under `--dry-run`.
pub struct Apply<W> {
    writes: W,
    dry_run: bool,
    events: Events,
}

impl<W: Writes> Apply<W> {
    pub fn new(writes: W, dry_run: bool, events: Events) -> Self {
        Self {
            writes,
            dry_run,
            events,
        }
    }

    /// The one place dry-run is decided: the writer, or `None` once `dry-run: would {what}`
    /// is logged.
    fn live(&self, name: &str, what: fmt::Arguments<'_>) -> Option<&W> {
        if self.dry_run {
            tracing::info!(
                servicecidr = KObj::cluster(name).field(),
                "dry-run: would {what}"
            );
            return None;
        }
        Some(&self.writes)
    }

    pub async fn add_finalizer(&self, name: &str) -> Result<Written, kube::Error> {
        let Some(w) = self.live(name, format_args!("add finalizer {FINALIZER}")) else {
            return Ok(Written::default());
        };
        let written = w.add_finalizer(name).await?;
        tracing::info!(
            servicecidr = KObj::cluster(name).field(),
            "added finalizer: ServiceCIDR is protected until its IPs are gone"
        );
        Ok(written)
    }

    /// Removes the finalizer of the ServiceCIDR judged at `resource_version`. A 409 means the
    /// object changed since: the finalizer stays, and the error sends the key back to be
    /// judged again on the cache's newer view.
    pub async fn remove_finalizer(
        &self,
        name: &str,
        resource_version: &str,
    ) -> Result<(), kube::Error> {
        let Some(w) = self.live(
            name,
            format_args!(
                "remove finalizer {FINALIZER} at resourceVersion {resource_version} (no IP would be orphaned, grace period over)"
            ),
        ) else {
            return Ok(());
        };
        if let Err(e) = w.remove_finalizer(name, resource_version).await {
            if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                tracing::info!(
                    servicecidr = KObj::cluster(name).field(),
                    resource_version,
                    "finalizer not removed: the ServiceCIDR changed since it was judged; judging it again"
                );
            }
            return Err(e);
        }
        tracing::info!(
            servicecidr = KObj::cluster(name).field(),
            "removed finalizer: no IP would be orphaned and the grace period is over"
        );
        Ok(())
    }

    /// What our apply left (its time and resourceVersion), when there was one.
    pub async fn apply_ready(
        &self,
        name: &str,
        c: &ReadyCondition,
        now: Timestamp,
    ) -> Result<Written, kube::Error> {
        let Some(w) = self.live(
            name,
            format_args!(
                "apply Ready condition (status {:?}, reason {:?})",
                c.status, c.reason
            ),
        ) else {
            return Ok(Written::default());
        };
        let written = w.apply_ready(name, c, now).await?;
        tracing::info!(servicecidr = KObj::cluster(name).field(), status = %c.status, reason = %c.reason, "applied Ready condition");
        Ok(written)
    }

    /// Records `notice` on `obj`; the same note again joins its series, a new note (another
    /// set of blockers) is an Event of its own. A failure is logged, never fatal to the sync.
    pub async fn publish(&self, obj: &ServiceCIDR, notice: &Notice) {
        let regarding = obj.object_ref(&());
        let name = regarding.name.clone().unwrap_or_default();
        let event = events::Notice {
            severity: if notice.warning {
                Severity::Warning
            } else {
                Severity::Normal
            },
            reason: notice.reason.clone(),
            action: notice.action.clone(),
            note: notice.note.clone(),
            regarding,
            repeat: Repeat::SeriesPerNote,
        };
        if let Err(e) = self.events.publish(&event).await {
            tracing::warn!(servicecidr = KObj::cluster(&name).field(), reason = %notice.reason, error = %e, "could not record event");
        }
    }
}

/// The API writes, each made through the fence: only while this replica holds a valid lease,
/// and dropped in flight when it stops holding one.
pub struct KubeWrites {
    api: Api<ServiceCIDR>,
    fence: Fence,
}

impl KubeWrites {
    pub fn new(client: Client, fence: Fence) -> Self {
        Self {
            api: Api::all(client),
            fence,
        }
    }

    /// A strategic-merge patch of the finalizer list under our patch field manager; NotFound
    /// is success (the object is gone).
    async fn patch_finalizers(
        &self,
        name: &str,
        body: serde_json::Value,
    ) -> Result<Written, kube::Error> {
        let params = PatchParams {
            field_manager: Some(PATCH_FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let body = Patch::Strategic(body);
        let patch = self.api.patch(name, &params, &body);
        match fenced(self.fence.guard(patch).await) {
            Ok(obj) => Ok(Written {
                resource_version: obj.metadata.resource_version,
                applied_at: None,
            }),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Written::default()),
            Err(e) => Err(e),
        }
    }
}

/// A fenced write fails like a failed request: the key is retried with backoff (and the process
/// is about to exit anyway, having lost its lease).
fn fenced<T>(r: Result<Result<T, kube::Error>, crate::leader::Fenced>) -> Result<T, kube::Error> {
    r.unwrap_or_else(|f| Err(kube::Error::Service(Box::new(f))))
}

/// The finalizer removal: a `resourceVersion` in a patch is a precondition, so the apiserver
/// removes the finalizer only from the object as it was judged (a write on a stale view, such
/// as a deposed leader's that landed late, fails with 409 Conflict).
pub fn removal_body(resource_version: &str) -> serde_json::Value {
    json!({"metadata": {
        "resourceVersion": resource_version,
        "$deleteFromPrimitiveList/finalizers": [FINALIZER],
    }})
}

/// The status apply body: only the Ready condition, as upstream's apply configuration.
pub fn ready_apply_body(name: &str, c: &ReadyCondition, now: Timestamp) -> serde_json::Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": { "name": name },
        "status": { "conditions": [{
            "type": CONDITION_READY,
            "status": c.status,
            "reason": c.reason,
            "message": c.message,
            "lastTransitionTime": Time(now),
        }]}
    })
}

impl Writes for KubeWrites {
    async fn add_finalizer(&self, name: &str) -> Result<Written, kube::Error> {
        self.patch_finalizers(name, json!({"metadata": {"finalizers": [FINALIZER]}}))
            .await
    }

    async fn remove_finalizer(
        &self,
        name: &str,
        resource_version: &str,
    ) -> Result<(), kube::Error> {
        self.patch_finalizers(name, removal_body(resource_version))
            .await
            .map(drop)
    }

    async fn apply_ready(
        &self,
        name: &str,
        c: &ReadyCondition,
        now: Timestamp,
    ) -> Result<Written, kube::Error> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let body = ready_apply_body(name, c, now);
        let obj = fenced(
            self.fence
                .guard(self.api.patch_status(name, &params, &Patch::Apply(body)))
                .await,
        )?;
        Ok(Written {
            applied_at: our_apply_time(obj.metadata.managed_fields.as_deref().unwrap_or_default()),
            resource_version: obj.metadata.resource_version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::{Fence, Term};
    use testkit::api::Mock;

    #[tokio::test]
    async fn a_standby_sends_no_write() {
        let mock = Mock::default();
        let (_tx, rx) = tokio::sync::watch::channel(Term::Standby);
        let w = KubeWrites::new(mock.client(), Fence::new(rx.clone()));
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        assert!(w.remove_finalizer("x", "7").await.is_err());
        assert!(w.add_finalizer("x").await.is_err());
        assert!(
            w.apply_ready("x", &ReadyCondition::ready(), now)
                .await
                .is_err()
        );
        // Events too: the Event writer passes the same fence.
        let events = Events::new(
            mock.client(),
            groundskeeper_plumbing::events::Reporter::in_pod(crate::servicecidr::REPORTER),
            false,
        )
        .fenced(std::sync::Arc::new(Fence::new(rx)));
        let e = events
            .publish(&events::Notice {
                severity: Severity::Normal,
                reason: "r".into(),
                action: "a".into(),
                note: "n".into(),
                regarding: Default::default(),
                repeat: Repeat::Series,
            })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not leading"), "{e}");
        assert!(mock.calls().is_empty(), "{:?}", mock.calls());

        // The same writes with a valid lease do reach the API.
        let w = KubeWrites::new(mock.client(), Fence::unbounded());
        // (The mock answers with a Pod, which does not parse: only the call matters here.)
        let _ = w.remove_finalizer("x", "7").await;
        assert_eq!(
            mock.calls(),
            ["PATCH /apis/networking.k8s.io/v1/servicecidrs/x"]
        );
    }

    /// The removal names the version it was judged on, beside the list change: without it
    /// the apiserver would apply the removal to whatever the object has become.
    #[test]
    fn removal_is_conditional_on_the_judged_version() {
        assert_eq!(
            removal_body("4711"),
            json!({"metadata": {
                "resourceVersion": "4711",
                "$deleteFromPrimitiveList/finalizers": [FINALIZER],
            }})
        );
    }

    #[test]
    fn apply_body_carries_only_the_ready_condition_with_empty_reason() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let b = ready_apply_body("x", &ReadyCondition::ready(), now);
        assert_eq!(
            b,
            json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "ServiceCIDR",
                "metadata": {"name": "x"},
                "status": {"conditions": [{
                    "type": "Ready",
                    "status": "True",
                    "reason": "",
                    "message": "Kubernetes Service CIDR is ready",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }]}
            })
        );
    }
}
