//! Spotting a second ServiceCIDR controller (kube-controller-manager's) writing our objects.
//!
//! Every write of groundskeeper's, from whichever replica, is made under one field manager,
//! `groundskeeper-controller-manager`, so a replica never takes its predecessor's writes for a
//! stranger's (applying status under kube-controller-manager's own name and comparing times
//! with this process's start would raise a false alarm at every failover). Two cheap
//! signs in `managedFields`, read from the cached object:
//!
//! * a status apply by `service-cidr-controller`, kube-controller-manager's manager name, later
//!   than our start (any time not among our own recorded applies);
//! * the finalizer is owned by an Update from a manager named `kube-controller-manager…` at a
//!   time later than our start: kube-controller-manager's controller added it (ours patches
//!   with its own field manager, so it never shows up under that name).
//!
//! Entries older than our start are history (e.g. from before kube-controller-manager's
//! controller was disabled) and are not reported. Times are the apiserver's, compared with our
//! clock for the start: a skewed clock can cause a false report in the first seconds after a
//! restart, never a missed one afterwards.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

use super::decide::FINALIZER;

/// Our field manager, for status applies and finalizer patches alike, in every replica.
pub const FIELD_MANAGER: &str = "groundskeeper-controller-manager";
/// The field manager of our finalizer patches (the same name: one owner for all our writes).
pub const PATCH_FIELD_MANAGER: &str = FIELD_MANAGER;
/// kube-controller-manager's ServiceCIDR controller applies status under this name; we never do.
pub const KCM_FIELD_MANAGER: &str = "service-cidr-controller";
const KCM_MANAGER_PREFIX: &str = "kube-controller-manager";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForeignWrite {
    /// A status apply under our field manager name that we did not make.
    StatusApply { at: Timestamp },
    /// kube-controller-manager added the finalizer.
    Finalizer { manager: String, at: Timestamp },
}

impl ForeignWrite {
    pub fn kind(&self) -> &'static str {
        match self {
            ForeignWrite::StatusApply { .. } => "status_apply",
            ForeignWrite::Finalizer { .. } => "finalizer",
        }
    }

    pub fn at(&self) -> Timestamp {
        match self {
            ForeignWrite::StatusApply { at } | ForeignWrite::Finalizer { at, .. } => *at,
        }
    }
}

/// The time of our own status apply entry in an apply response, to remember as ours.
pub fn our_apply_time(entries: &[ManagedFieldsEntry]) -> Option<Timestamp> {
    entries
        .iter()
        .find(|e| is_status_apply(e))
        .and_then(|e| e.time.as_ref().map(|t| t.0))
}

fn is_status_apply(e: &ManagedFieldsEntry) -> bool {
    is_status_apply_by(e, FIELD_MANAGER)
}

fn is_kcm_status_apply(e: &ManagedFieldsEntry) -> bool {
    is_status_apply_by(e, KCM_FIELD_MANAGER)
}

fn is_status_apply_by(e: &ManagedFieldsEntry, manager: &str) -> bool {
    e.manager.as_deref() == Some(manager)
        && e.operation.as_deref() == Some("Apply")
        && e.subresource.as_deref() == Some("status")
}

fn owns_finalizer(e: &ManagedFieldsEntry) -> bool {
    let key = format!("v:{}", serde_json::Value::String(FINALIZER.into()));
    e.fields_v1
        .as_ref()
        .and_then(|f| f.0.get("f:metadata"))
        .and_then(|m| m.get("f:finalizers"))
        .and_then(|f| f.as_object())
        .is_some_and(|f| f.contains_key(&key))
}

/// Writes by another controller visible in `entries`, ignoring our own applies (`ours`) and
/// anything older than `started`.
pub fn foreign_writes(
    entries: &[ManagedFieldsEntry],
    ours: &[Timestamp],
    started: Timestamp,
) -> Vec<ForeignWrite> {
    let mut out = Vec::new();
    for e in entries {
        let Some(at) = e.time.as_ref().map(|t| t.0) else {
            continue;
        };
        if at < started {
            continue;
        }
        if is_kcm_status_apply(e) && !ours.contains(&at) {
            out.push(ForeignWrite::StatusApply { at });
        }
        let manager = e.manager.as_deref().unwrap_or_default();
        if manager.starts_with(KCM_MANAGER_PREFIX)
            && e.operation.as_deref() == Some("Update")
            && owns_finalizer(e)
        {
            out.push(ForeignWrite::Finalizer {
                manager: manager.to_string(),
                at,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, Time};
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn entry(
        manager: &str,
        op: &str,
        sub: Option<&str>,
        at: &str,
        fields: serde_json::Value,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            api_version: Some("networking.k8s.io/v1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            manager: Some(manager.into()),
            operation: Some(op.into()),
            subresource: sub.map(String::from),
            time: Some(Time(ts(at))),
        }
    }

    fn finalizer_fields() -> serde_json::Value {
        json!({"f:metadata": {"f:finalizers": {".": {}, "v:\"networking.k8s.io/service-cidr-finalizer\"": {}}}})
    }

    fn status_fields() -> serde_json::Value {
        json!({"f:status": {"f:conditions": {}}})
    }

    /// Our field manager's status apply at `at`.
    fn status_apply(at: &str) -> ManagedFieldsEntry {
        entry(FIELD_MANAGER, "Apply", Some("status"), at, status_fields())
    }

    /// kube-controller-manager's status apply at `at`.
    fn kcm_status_apply(at: &str) -> ManagedFieldsEntry {
        entry(
            KCM_FIELD_MANAGER,
            "Apply",
            Some("status"),
            at,
            status_fields(),
        )
    }

    /// An Update by `manager` at `at` that owns the finalizer.
    fn finalizer_update(manager: &str, at: &str) -> ManagedFieldsEntry {
        entry(manager, "Update", None, at, finalizer_fields())
    }

    const START: &str = "2026-01-01T00:00:00Z";

    #[test]
    fn own_applies_and_history_are_not_reported() {
        let entries = vec![
            status_apply("2026-01-01T00:00:05Z"),
            finalizer_update(PATCH_FIELD_MANAGER, "2026-01-01T00:00:04Z"),
            // kube-controller-manager's finalizer from before we started.
            finalizer_update("kube-controller-manager", "2025-12-31T00:00:00Z"),
        ];
        assert_eq!(
            foreign_writes(&entries, &[ts("2026-01-01T00:00:05Z")], ts(START)),
            vec![]
        );
        assert_eq!(our_apply_time(&entries), Some(ts("2026-01-01T00:00:05Z")));
    }

    /// The failover case: the previous leader (another replica, or this pod before a restart)
    /// applied status after this process started, at a time this process did not record.
    #[test]
    fn another_replicas_applies_are_not_reported() {
        let entries = vec![
            status_apply("2026-01-01T00:00:09Z"),
            finalizer_update(PATCH_FIELD_MANAGER, "2026-01-01T00:00:08Z"),
        ];
        assert_eq!(foreign_writes(&entries, &[], ts(START)), vec![]);
    }

    #[test]
    fn foreign_status_apply_and_kcm_finalizer_are_reported() {
        let entries = vec![
            kcm_status_apply("2026-01-01T00:00:07Z"),
            finalizer_update("kube-controller-manager", "2026-01-01T00:00:06Z"),
        ];
        let got = foreign_writes(&entries, &[ts("2026-01-01T00:00:05Z")], ts(START));
        assert_eq!(
            got,
            vec![
                ForeignWrite::StatusApply {
                    at: ts("2026-01-01T00:00:07Z")
                },
                ForeignWrite::Finalizer {
                    manager: "kube-controller-manager".into(),
                    at: ts("2026-01-01T00:00:06Z")
                },
            ]
        );
        assert_eq!(got[0].kind(), "status_apply");
    }

    #[test]
    fn unrelated_entries_are_ignored() {
        let entries = vec![
            // Another manager's status write, or kcm owning something other than the finalizer.
            entry(
                "kubectl",
                "Apply",
                Some("status"),
                "2026-01-01T00:00:07Z",
                status_fields(),
            ),
            entry(
                "kube-controller-manager",
                "Update",
                None,
                "2026-01-01T00:00:07Z",
                json!({"f:metadata": {"f:labels": {}}}),
            ),
            finalizer_update("kube-apiserver", "2026-01-01T00:00:07Z"),
            entry(
                KCM_FIELD_MANAGER,
                "Update",
                Some("status"),
                "2026-01-01T00:00:07Z",
                status_fields(),
            ),
        ];
        assert_eq!(foreign_writes(&entries, &[], ts(START)), vec![]);
    }
}
