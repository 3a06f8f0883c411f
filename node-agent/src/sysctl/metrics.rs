//! Admission's Prometheus metrics.
//!
//! Pods checked, rejected (by reason and mode), and started pods the policy would forbid.

use groundskeeper_plumbing::metrics::registered;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub checked: IntCounter,
    pub rejected: IntCounterVec,
    pub started_forbidden: IntCounterVec,
}

impl Metrics {
    pub fn register(registry: &Registry) -> anyhow::Result<Self> {
        let checked = registered(
            registry,
            IntCounter::new(
                "groundskeeper_sysctl_pods_checked_total",
                "Pods bound to this node whose sysctls were checked (once per change of sysctls or outcome).",
            ),
        )?;
        let rejected = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_pods_rejected_total",
                    "Pods found to use forbidden sysctls, by reason and mode (Enforce: failed; Audit: warned).",
                ),
                &["reason", "mode"],
            ),
        )?;
        let started_forbidden = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_started_pods_forbidden_total",
                    "Started pods (kubelet admitted them) that the node's policy would forbid, by the mode \
                 in force; they are never failed, only reported. Counted per agent process.",
                ),
                &["mode"],
            ),
        )?;
        Ok(Self {
            checked,
            rejected,
            started_forbidden,
        })
    }
}
