//! Admission's Prometheus metrics.
//!
//! Pods checked, rejected (by reason and mode), started pods the policy would forbid, and
//! writes about pods the apiserver refused.

use groundskeeper_plumbing::metrics::registered;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub checked: IntCounter,
    pub rejected: IntCounterVec,
    pub started_forbidden: IntCounterVec,
    pub pod_write_failures: IntCounterVec,
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
        let pod_write_failures = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_pod_write_failures_total",
                    "Writes about a pod (its fail patch, its report Event) that failed, by HTTP code (0: no answer). \
                 Each is retried at the next tick, then after 2 s, 4 s, ... up to 5 min.",
                ),
                &["code"],
            ),
        )?;
        Ok(Self {
            checked,
            rejected,
            started_forbidden,
            pod_write_failures,
        })
    }
}
