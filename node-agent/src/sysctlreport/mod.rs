//! Sysctl reports, kubelet-style: the flags and `run`.
//!
//! A pod bound to this node whose sysctls the node does not allow is reported once kubelet has
//! started it (as having run despite Enforce, as audited, or as started before the policy);
//! no pod is ever written. Keeping such pods off the node is the controller-manager's admission
//! webhook's. Kubelet's default pod sysctls (`--default-pod-sysctls`) are judged by the Node's
//! kubelet version and flagged on the Node when it can not apply one. The rules are the shared
//! `groundskeeper_sysctl_rules` crate's.

pub mod apply;
pub mod cache;
pub mod check;
pub mod decide;
#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod defaults_tests;
pub mod metrics;
pub mod worker;
#[cfg(test)]
mod worker_tests;
#[cfg(test)]
mod writes_tests;

// The rules themselves are shared with the controller-manager's admission webhook.
pub use groundskeeper_sysctl_rules::{allowlist, crd, kernel, kubelet, names, policy, safe};

use groundskeeper_plumbing::life::component::{Crew, Life};
use groundskeeper_plumbing::watch::cache::Shared;
use groundskeeper_sysctl_rules::args::{PolicyArgs, parse_default_pod_sysctls};
use groundskeeper_sysctl_rules::defaults::DefaultPodSysctls;
use kernel::KernelVersion;

use crate::context::Context;
use apply::{KubeWrites, Writer};
use metrics::Metrics;
use worker::{Settings, Worker};

/// The flags of the agent's sysctl reports.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Sysctl admission")]
pub struct SysctlArgs {
    /// Kernel release to gate the safe sysctls by, instead of /proc/sys/kernel/osrelease
    /// (for tests and for agents that can not read the host's /proc).
    #[arg(long, env = "GROUNDSKEEPER_KERNEL_VERSION", value_parser = check::parse_kernel_version)]
    pub kernel_version: Option<KernelVersion>,

    /// Kubelet's `defaultPodSysctls` on this node (kubelet v1.37 on), comma-separated
    /// `name=value` (e.g. `net.core.somaxconn=1024,kernel.shmmax=68719476736`; a comma followed
    /// by a digit stays in the value). Reported, never applied: each default the node's kubelet
    /// or kernel can not apply is flagged with a Warning Event on the Node. At most 64.
    #[arg(long, env = "GROUNDSKEEPER_DEFAULT_POD_SYSCTLS", default_value = "", hide_default_value = true, value_parser = parse_default_pod_sysctls)]
    pub default_pod_sysctls: DefaultPodSysctls,

    // Last: a flattened struct's heading carries over to the fields after it.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// The kernel to gate the safe list by: the flag, else the host's; unknown only drops the
/// gated entries, as in kubelet.
fn kernel(args: &SysctlArgs) -> Option<KernelVersion> {
    match &args.kernel_version {
        Some(k) => Some(k.clone()),
        None => KernelVersion::from_host()
            .inspect_err(|e| tracing::warn!(error = %e, "kernel version unknown; kernel-gated safe sysctls are not allowed"))
            .ok(),
    }
}

/// Watches this node's pods, the SysctlPolicies and this Node, and admits until cancelled.
pub async fn run(ctx: Context, args: SysctlArgs) -> anyhow::Result<()> {
    let kernel = kernel(&args);
    let policy = &args.policy;
    // The safe list also depends on the Node's kubelet version: logged once the Node is read.
    tracing::info!(kernel = %kernel.as_ref().map_or_else(|| "unknown".to_string(), ToString::to_string), allowed_unsafe = %groundskeeper_plumbing::logging::telemetry::joined(policy.allowed_unsafe_sysctls()), default_mode = %policy.sysctl_default_mode, default_pod_sysctls = %args.default_pod_sysctls, "sysctl admission starting");
    let metrics = Metrics::register(&ctx.base.registry)?;
    let cache = Shared::default();
    let (watches, changes) = cache::follow_all(
        &ctx.base.readiness,
        &ctx.base.client,
        &ctx.node_name,
        &cache,
    );
    let writer = Writer::new(
        KubeWrites::new(ctx.base.client.clone()),
        ctx.base.dry_run,
        ctx.events(crate::context::SYSCTL_REPORTER),
    );
    let settings = Settings {
        node_name: ctx.node_name.clone(),
        kernel,
        flag: policy.allowed_unsafe_sysctls(),
        default_mode: policy.sysctl_default_mode,
        defaults: args.default_pod_sysctls.clone(),
    };
    let worker = Worker::new(settings, cache, watches, writer, metrics);
    // No gate: every agent reports on its own node. Its watches are the worker's own changes.
    let token = ctx.base.token.clone();
    Life::new("sysctl", token.clone())
        .run(async {}, || {
            Crew::default().task(worker.run(changes, token.cancelled_owned()))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::SysctlArgs;

    /// The policy flags are the shared crate's (tested there); the agent adds the kernel.
    #[test]
    fn flags_parse_and_bad_values_are_named() {
        let parse = testkit::cli::args::<SysctlArgs>;
        let args = parse(&[
            "--allowed-unsafe-sysctls",
            "kernel.msg*,net/core/somaxconn,",
            "--kernel-version",
            "5.14.0-427.el9.x86_64",
        ])
        .unwrap();
        assert_eq!(
            args.policy.allowed_unsafe_sysctls(),
            vec!["kernel.msg*", "net/core/somaxconn"]
        );
        assert_eq!(args.kernel_version.unwrap().to_string(), "5.14.0");
        let e = parse(&["--kernel-version", "linux"]).unwrap_err();
        assert!(e.contains("--kernel-version") && e.contains("linux"), "{e}");
    }

    /// Kubelet's default pod sysctls: none unless given; a bad list stops the agent at start-up
    /// with what is wrong, as kubelet refuses such a configuration.
    #[test]
    fn default_pod_sysctls_parse_and_bad_lists_are_named() {
        let parse = testkit::cli::args::<SysctlArgs>;
        assert!(parse(&[]).unwrap().default_pod_sysctls.is_empty());
        let args = parse(&[
            "--default-pod-sysctls",
            "net.core.somaxconn=1024,net.ipv4.tcp_rmem=4096 87380 6291456",
        ])
        .unwrap();
        assert_eq!(
            args.default_pod_sysctls.to_string(),
            "net.core.somaxconn=1024,net.ipv4.tcp_rmem=4096 87380 6291456"
        );
        for (bad, says) in [
            ("net.core.somaxconn", "missing '='"),
            ("a.b=1,a.b=2", "given twice"),
        ] {
            let e = parse(&["--default-pod-sysctls", bad]).unwrap_err();
            assert!(
                e.contains("--default-pod-sysctls") && e.contains(says),
                "{e}"
            );
        }
    }
}
