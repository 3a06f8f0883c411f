//! The reports' Prometheus metrics.
//!
//! Pods checked; started pods the node's verdict forbade when they started (by mode: Enforce
//! means the policy did not keep them off); started pods a later verdict forbids; what the
//! node's kubelet does with each of its default pod sysctls. The agent rejects nothing, so no
//! metric of its says "rejected" (the webhook counts the bindings it denied).

use groundskeeper_plumbing::metrics::registered;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub checked: IntCounter,
    pub ran_forbidden: IntCounterVec,
    pub started_forbidden: IntCounterVec,
    /// `error`: [`WriteError::metric_label`](super::apply::WriteError::metric_label).
    pub write_errors: IntCounterVec,
    /// `sysctl`, `state`: 1 for each default's state, 0 for the others. Bounded by
    /// `defaults::MAX_DEFAULTS` defaults and three states.
    pub default_pod_sysctls: IntGaugeVec,
}

impl Metrics {
    pub fn register(registry: &Registry) -> anyhow::Result<Self> {
        let checked = registered(
            registry,
            IntCounter::new(
                "groundskeeper_sysctl_pods_checked_total",
                "Pods bound to this node whose sysctls were checked (once per change of sysctls, verdict or start).",
            ),
        )?;
        let ran_forbidden = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_pods_ran_forbidden_total",
                    "Pods kubelet started on this node while the node's sysctl policy already forbade them, by \
                     mode: Enforce (the admission webhook did not keep them off: it was down under failurePolicy \
                     Ignore, bypassed or not installed) or Audit (reported as designed). Never stopped.",
                ),
                &["mode"],
            ),
        )?;
        let started_forbidden = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_started_pods_forbidden_total",
                    "Pods that had started before the node's policy came to forbid them (a policy created, \
                     narrowed or moved onto the node later), by the mode in force; never stopped, only \
                     reported. Counted per agent process.",
                ),
                &["mode"],
            ),
        )?;
        let write_errors = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_write_errors_total",
                    "Failed writes of the agent's sysctl admission (report Events, default pod sysctl \
                     Events on the Node, SysctlPolicy status; retried), by what the apiserver answered: forbidden, not_found, conflict, \
                     too_many_requests, server_error, transport (no answer), other.",
                ),
                &["error"],
            ),
        )?;
        let default_pod_sysctls = registered(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "groundskeeper_sysctl_default_pod_sysctls",
                    "This node's default pod sysctls (kubelet's defaultPodSysctls, as the agent's \
                     --default-pod-sysctls lists them) by state, 1 for the state each is in: applied, \
                     ignored (the node's kubelet has no defaultPodSysctls) or unavailable (its kubelet \
                     refuses it, or its kernel does not have it in the pod's namespace).",
                ),
                &["sysctl", "state"],
            ),
        )?;
        Ok(Self {
            default_pod_sysctls,
            write_errors,
            checked,
            ran_forbidden,
            started_forbidden,
        })
    }
}
