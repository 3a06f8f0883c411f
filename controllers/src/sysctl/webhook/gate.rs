//! The mutating webhook on pod CREATE: a pod that sets sysctls and names no node gets the
//! scheduling gate [`GATE`], so no scheduler binds it before the leader's placement
//! (`sysctl::placement`) has narrowed it to the nodes that admit it and taken the gate off.
//!
//! Why a gate and not a refusal: the chart registers this webhook with `failurePolicy: Fail`
//! and `matchConditions` that pass only pods setting sysctls some node could forbid. While no
//! replica answers, those pods are not created (fail closed) and every other pod never reaches
//! us, so an outage of groundskeeper blocks nothing else. Only pods Enforce could refuse are
//! gated: not one whose sysctls every node allows ([`allowed_everywhere`]), nor any pod while
//! nothing in the cluster enforces (no Enforce SysctlPolicy, default mode Audit), so a default
//! install changes nothing for workloads. Until the SysctlPolicies have listed, a replica gates
//! (it can not know), so it answers from its first second. Pure: `mutate.rs` serves it.

use groundskeeper_sysctl_rules::{args::PolicyArgs, verdict::allowed_everywhere};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::sysctl::facts::{GATE, MIRROR_ANNOTATION};

/// Whether any node of the cluster could enforce its sysctl policy, as the replica knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enforcement {
    /// The SysctlPolicies have not listed yet: any node may enforce.
    Unknown,
    /// The default mode is Audit and no SysctlPolicy is Enforce: nothing can be refused.
    Nowhere,
    /// The default mode or some SysctlPolicy is Enforce.
    Possible,
}

/// What the webhook does with a created pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Gating {
    /// Not ours to gate (why, for the debug log): no sysctl, already bound, a mirror pod.
    Pass(&'static str),
    /// The gate is already there (a client that set it, or a retried request).
    AlreadyGated,
    /// Add the gate with this JSON patch (RFC 6902).
    Gate(serde_json::Value),
}

/// Whether `pod` (as created) gets the gate, and the patch that adds it.
pub fn gating(pod: &Pod, args: &PolicyArgs, enforcement: Enforcement) -> Gating {
    let Some(spec) = pod.spec.as_ref() else {
        return Gating::Pass("no spec");
    };
    let sets_sysctls = spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.as_ref())
        .is_some_and(|s| !s.is_empty());
    if !sets_sysctls {
        return Gating::Pass("sets no sysctl");
    }
    // Bound at creation: no scheduler is involved, and a gate on a bound pod is refused by the
    // apiserver. The validating webhook judges it on its node.
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return Gating::Pass("names its node");
    }
    if pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return Gating::Pass("a mirror pod");
    }
    if enforcement == Enforcement::Nowhere {
        return Gating::Pass("nothing enforces a sysctl policy");
    }
    if allowed_everywhere(args, spec) {
        return Gating::Pass("every node allows its sysctls");
    }
    match spec.scheduling_gates.as_ref() {
        Some(gates) if gates.iter().any(|g| g.name == GATE) => Gating::AlreadyGated,
        Some(_) => Gating::Gate(json!([
            {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}
        ])),
        None => Gating::Gate(json!([
            {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
        ])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}))
            .unwrap()
    }

    const SYSCTLS: &str = r#"{"sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]}"#;

    fn args(flag: &[&str]) -> PolicyArgs {
        PolicyArgs {
            allowed_unsafe_sysctls: flag.iter().map(|s| s.to_string()).collect(),
            sysctl_default_mode: groundskeeper_sysctl_rules::crd::Mode::Audit,
        }
    }

    /// As a replica whose policies have not listed: only the pod decides.
    fn gating(p: &Pod) -> Gating {
        super::gating(p, &args(&[]), Enforcement::Unknown)
    }

    fn with_sysctls(extra: serde_json::Value) -> Pod {
        let mut spec = json!({"containers": [], "securityContext": serde_json::from_str::<serde_json::Value>(SYSCTLS).unwrap()});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        pod(spec)
    }

    #[test]
    fn only_unbound_pods_setting_sysctls_are_gated() {
        for (name, p, want) in [
            ("no security context", pod(json!({"containers": []})), false),
            (
                "empty sysctls",
                pod(json!({"containers": [], "securityContext": {"sysctls": []}})),
                false,
            ),
            (
                "bound at creation",
                with_sysctls(json!({"nodeName": "n1"})),
                false,
            ),
            ("sets sysctls", with_sysctls(json!({})), true),
            (
                "empty nodeName is unbound",
                with_sysctls(json!({"nodeName": ""})),
                true,
            ),
        ] {
            assert_eq!(
                matches!(gating(&p), Gating::Gate(_)),
                want,
                "{name}: {:?}",
                gating(&p)
            );
        }
        let mut mirror = with_sysctls(json!({}));
        mirror.metadata.annotations =
            Some([(MIRROR_ANNOTATION.to_string(), "x".to_string())].into());
        assert_eq!(gating(&mirror), Gating::Pass("a mirror pod"));
    }

    /// Only pods Enforce could refuse: not while nothing enforces, not when every node allows
    /// every sysctl the pod sets (safe on every kernel, or allowed by the flags every node
    /// shares); gated while the policies are unknown or some policy enforces.
    #[test]
    fn only_pods_enforce_could_refuse_are_gated() {
        let unsafe_pod = with_sysctls(json!({}));
        let safe = pod(json!({"containers": [], "securityContext": {"sysctls": [
            {"name": "kernel.shm_rmid_forced", "value": "1"},
            {"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}]}}));
        let gated =
            |p: &Pod, flag: &[&str], e| matches!(super::gating(p, &args(flag), e), Gating::Gate(_));
        assert!(gated(&unsafe_pod, &[], Enforcement::Unknown));
        assert!(gated(&unsafe_pod, &[], Enforcement::Possible));
        assert!(!gated(&unsafe_pod, &[], Enforcement::Nowhere));
        assert!(!gated(&unsafe_pod, &["net.core.*"], Enforcement::Possible));
        assert!(!gated(&safe, &[], Enforcement::Unknown));
        // A kernel-gated safe sysctl: a node with an old or unknown kernel refuses it.
        let gated_by_kernel = pod(json!({"containers": [], "securityContext": {"sysctls": [
            {"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}}));
        assert!(gated(&gated_by_kernel, &[], Enforcement::Possible));
        // A safe Net sysctl with hostNetwork: every node refuses it, so it is gated (and held).
        let mut host = safe.clone();
        host.spec.as_mut().unwrap().host_network = Some(true);
        assert!(gated(&host, &[], Enforcement::Possible));
    }

    /// The patch, applied the way the apiserver applies it, leaves the pod's own gates in place
    /// and ours once, whatever gates the pod came with.
    #[test]
    fn the_patch_adds_our_gate_once_and_keeps_the_others() {
        for before in [
            None,
            Some(json!([])),
            Some(json!([{"name": "example.com/quota"}])),
        ] {
            let mut extra = json!({});
            if let Some(b) = &before {
                extra["schedulingGates"] = b.clone();
            }
            let p = with_sysctls(extra);
            let Gating::Gate(patch) = gating(&p) else {
                panic!("{before:?}: not gated")
            };
            let mut doc = serde_json::to_value(&p).unwrap();
            apply_json_patch(&mut doc, &patch);
            let after: Pod = serde_json::from_value(doc).unwrap();
            let names: Vec<String> = after
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.clone())
                .unwrap()
                .into_iter()
                .map(|g| g.name)
                .collect();
            let mut want: Vec<String> = before
                .iter()
                .flat_map(|b| b.as_array().unwrap().iter())
                .map(|g| g["name"].as_str().unwrap().to_string())
                .collect();
            want.push(GATE.into());
            assert_eq!(names, want, "{before:?}");
            assert_eq!(gating(&after), Gating::AlreadyGated);
        }
    }

    /// The two `add` forms the patch uses: a new member, and `-` (append to an array).
    fn apply_json_patch(doc: &mut serde_json::Value, patch: &serde_json::Value) {
        for op in patch.as_array().unwrap() {
            assert_eq!(op["op"], "add");
            let path: Vec<&str> = op["path"].as_str().unwrap().split('/').skip(1).collect();
            let (last, parents) = path.split_last().unwrap();
            let mut at = &mut *doc;
            for p in parents {
                at = at.get_mut(*p).unwrap();
            }
            if *last == "-" {
                at.as_array_mut().unwrap().push(op["value"].clone());
            } else {
                assert!(at.get(*last).is_none(), "add over an existing member");
                at[*last] = op["value"].clone();
            }
        }
    }
}
