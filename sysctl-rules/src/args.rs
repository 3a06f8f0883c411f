//! The flags both binaries take for the node's policy, parsed the same way in both.
//!
//! The node-agent and the controller-manager's webhook must judge a pod on a node alike, so the
//! chart passes them the same values; a bad pattern stops either at start-up with kubelet's
//! message.

use super::allowlist::check_pattern_in;
use super::crd::Mode;
use super::defaults::DefaultPodSysctls;
use super::kernel::{KernelVersion, ParseKernelVersionError};
use super::kubelet::{KubeletVersion, ParseKubeletVersionError};
use super::names::NamespaceTable;

/// What a node is allowed beyond the safe list and the SysctlPolicies, and what it does when no
/// policy selects it.
#[derive(clap::Args, Debug, Clone, PartialEq)]
#[command(next_help_heading = "Sysctl policy")]
pub struct PolicyArgs {
    /// Comma-separated unsafe sysctl patterns allowed on every node in addition to the safe
    /// list, like kubelet's flag of the same name (e.g. `kernel.msg*,net.core.somaxconn`).
    /// SysctlPolicy objects add to it.
    #[arg(long, env = "GROUNDSKEEPER_ALLOWED_UNSAFE_SYSCTLS", value_delimiter = ',', value_parser = parse_flag_pattern)]
    pub allowed_unsafe_sysctls: Vec<String>,

    /// The mode of a node no SysctlPolicy selects: `audit` (default) only reports a forbidden
    /// pod; `enforce` keeps it off the node (admission webhook). Audit by default so that
    /// installing groundskeeper changes nothing for workloads; a policy selecting the node
    /// decides instead. A started pod is never failed, in either mode.
    #[arg(
        long,
        env = "GROUNDSKEEPER_SYSCTL_DEFAULT_MODE",
        value_enum,
        ignore_case = true,
        default_value = "audit"
    )]
    pub sysctl_default_mode: Mode,
}

impl PolicyArgs {
    /// The flag's patterns, empty items dropped.
    pub fn allowed_unsafe_sysctls(&self) -> Vec<String> {
        self.allowed_unsafe_sysctls
            .iter()
            .filter(|p| !p.is_empty())
            .cloned()
            .collect()
    }
}

/// A flag pattern; an empty item (`--allowed-unsafe-sysctls=`, a trailing or doubled comma) is
/// no pattern. Laxer than kubelet on purpose: its string-slice flag keeps the empty item of
/// `a,` and refuses it as a pattern, so kubelet does not start; here it allows nothing either
/// way, and a chart list with an empty entry does not stop every node's agent.
fn parse_flag_pattern(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Ok(String::new())
    } else {
        parse_pattern(s)
    }
}

/// A pattern as the newest known kubelet accepts it in `--allowed-unsafe-sysctls`; on a node
/// whose kubelet does not know the pattern's namespace it allows nothing.
pub fn parse_pattern(s: &str) -> Result<String, String> {
    check_pattern_in(NamespaceTable::NEWEST, s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// A kubelet version for a flag: unparseable is an error; outside the known range it parses,
/// and `Kubelet::from_reported` says which rules it gets.
pub fn parse_kubelet_version(s: &str) -> Result<String, String> {
    s.parse::<KubeletVersion>()
        .map(|_| s.trim().to_string())
        .map_err(|e: ParseKubeletVersionError| e.to_string())
}

/// Kubelet's `defaultPodSysctls` for a flag: `name=value` items, comma-separated
/// (`defaults::parse`).
pub fn parse_default_pod_sysctls(s: &str) -> Result<DefaultPodSysctls, String> {
    super::defaults::parse(s).map_err(|e| e.to_string())
}

pub fn parse_kernel_version(s: &str) -> Result<KernelVersion, String> {
    s.parse()
        .map_err(|e: ParseKernelVersionError| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_bad_values_are_named() {
        let parse = testkit::cli::args::<PolicyArgs>;
        let args = parse(&[
            "--allowed-unsafe-sysctls",
            "kernel.msg*,net/core/somaxconn,",
        ])
        .unwrap();
        assert_eq!(
            args.allowed_unsafe_sysctls(),
            vec!["kernel.msg*", "net/core/somaxconn"]
        );
        assert_eq!(
            args.sysctl_default_mode,
            Mode::Audit,
            "a default install only audits"
        );
        for (value, want) in [
            ("enforce", Mode::Enforce),
            ("Enforce", Mode::Enforce),
            ("audit", Mode::Audit),
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
        // What the newest known kubelet (v1.38, as v1.37) takes is taken.
        let newer = parse(&["--allowed-unsafe-sysctls", "kernel.domainname,user.*"]).unwrap();
        assert_eq!(newer.allowed_unsafe_sysctls().len(), 2);
        let e = parse(&["--allowed-unsafe-sysctls", "Net.*"]).unwrap_err();
        assert!(
            e.contains(r#"sysctl "Net.*" must have at most 253 characters"#),
            "{e}"
        );
    }
}
