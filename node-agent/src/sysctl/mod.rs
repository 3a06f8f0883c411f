//! Sysctl admission, kubelet-style: the flags and `run`.
//!
//! A pod bound to this node whose sysctls the node does not allow is failed (Enforce) or
//! reported (Audit). The allowlist is kubelet's, the extra patterns come from the agent's flag
//! and SysctlPolicy objects.

pub mod admission;
#[cfg(test)]
mod admission_tests;
pub mod allowlist;
pub mod apply;
pub mod cache;
pub mod check;
pub mod crd;
pub mod decide;
#[cfg(test)]
mod decide_tests;
pub mod kernel;
pub mod metrics;
pub mod names;
pub mod policy;
pub mod safe;

use futures::StreamExt;
use groundskeeper_plumbing::cache::Shared;
use kernel::KernelVersion;

use crate::context::Context;
use admission::{Admission, Settings, TICK};
use apply::{KubeWrites, Writer};
use metrics::Metrics;

/// The agent's sysctl admission flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SysctlArgs {
    /// Comma-separated unsafe sysctl patterns allowed on this node in addition to the safe
    /// list, like kubelet's flag of the same name (e.g. `kernel.msg*,net.core.somaxconn`).
    /// SysctlPolicy objects add to it.
    #[arg(long, env = "ALLOWED_UNSAFE_SYSCTLS", value_delimiter = ',', value_parser = parse_flag_pattern)]
    pub allowed_unsafe_sysctls: Vec<String>,

    /// What a node no SysctlPolicy selects does with a forbidden pod that has not started:
    /// `audit` (default) only reports it (event, metric); `enforce` fails it as kubelet would.
    /// Audit by default so that installing the agent changes nothing for workloads; a policy
    /// selecting the node decides instead. A started pod is never failed, in either mode.
    #[arg(
        long,
        env = "SYSCTL_DEFAULT_MODE",
        value_enum,
        ignore_case = true,
        default_value = "audit"
    )]
    pub sysctl_default_mode: crd::Mode,

    /// Kernel release to gate the safe sysctls by, instead of /proc/sys/kernel/osrelease
    /// (for tests and for agents that can not read the host's /proc).
    #[arg(long, env = "KERNEL_VERSION", value_parser = check::parse_kernel_version)]
    pub kernel_version: Option<KernelVersion>,
}

/// A flag pattern; an empty item (`--allowed-unsafe-sysctls=` or a trailing comma) is no
/// pattern, as kubelet's string-slice flag has it.
fn parse_flag_pattern(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Ok(String::new())
    } else {
        check::parse_pattern(s)
    }
}

impl SysctlArgs {
    /// The flag's patterns, empty items dropped.
    pub fn allowed_unsafe_sysctls(&self) -> Vec<String> {
        self.allowed_unsafe_sysctls
            .iter()
            .filter(|p| !p.is_empty())
            .cloned()
            .collect()
    }
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
    let safe = safe::safe_sysctls(kernel.as_ref());
    tracing::info!(kernel = ?kernel.as_ref().map(ToString::to_string), safe = ?safe, allowed_unsafe = ?args.allowed_unsafe_sysctls(), default_mode = %args.sysctl_default_mode, "sysctl admission starting");
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
        ctx.node_name.clone(),
    );
    let settings = Settings {
        node_name: ctx.node_name.clone(),
        safe,
        flag: args.allowed_unsafe_sysctls(),
        default_mode: args.sysctl_default_mode,
    };
    let mut admission = Admission::new(settings, cache, watches, writer, metrics);

    let mut changes = std::pin::pin!(changes);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ctx.base.token.cancelled() => break,
            Some(change) = changes.next() => admission.on_change(change).await,
            _ = tick.tick() => admission.on_tick().await,
        }
    }
    tracing::info!(
        decisions = admission.decisions(),
        "sysctl admission stopped"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::SysctlArgs;

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
            args.allowed_unsafe_sysctls(),
            vec!["kernel.msg*", "net/core/somaxconn"]
        );
        assert_eq!(args.kernel_version.unwrap().to_string(), "5.14.0");
        assert_eq!(
            args.sysctl_default_mode,
            crate::sysctl::crd::Mode::Audit,
            "a default install only audits"
        );
        for (value, want) in [
            ("enforce", crate::sysctl::crd::Mode::Enforce),
            ("Enforce", crate::sysctl::crd::Mode::Enforce),
            ("audit", crate::sysctl::crd::Mode::Audit),
        ] {
            let args = parse(&["--sysctl-default-mode", value]).unwrap();
            assert_eq!(args.sysctl_default_mode, want, "{value}");
        }
        let e = parse(&["--sysctl-default-mode", "strict"]).unwrap_err();
        assert!(
            e.contains("--sysctl-default-mode") && e.contains("strict"),
            "{e}"
        );
        assert!(
            parse(&["--allowed-unsafe-sysctls="])
                .unwrap()
                .allowed_unsafe_sysctls()
                .is_empty()
        );

        let e = parse(&["--allowed-unsafe-sysctls", "net.*,vm.swappiness"]).unwrap_err();
        assert!(
            e.contains("vm.swappiness") && e.contains("not known to be namespaced"),
            "{e}"
        );
        let e = parse(&["--allowed-unsafe-sysctls", "Net.*"]).unwrap_err();
        assert!(
            e.contains(r#"sysctl "Net.*" must have at most 253 characters"#),
            "{e}"
        );
        let e = parse(&["--kernel-version", "linux"]).unwrap_err();
        assert!(e.contains("--kernel-version") && e.contains("linux"), "{e}");
    }
}
