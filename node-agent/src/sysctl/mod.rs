//! Sysctl admission, kubelet-style: a pod bound to this node whose sysctls the node does not
//! allow is failed (Enforce) or reported (Audit). The allowlist is kubelet's, the extra patterns
//! come from the agent's flag and SysctlPolicy objects.

pub mod admit;
pub mod allowlist;
pub mod check;
pub mod crd;
pub mod decide;
pub mod kernel;
pub mod names;
pub mod policy;
pub mod safe;

use kernel::KernelVersion;

/// The agent's sysctl admission flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SysctlArgs {
    /// Comma-separated unsafe sysctl patterns allowed on this node in addition to the safe
    /// list, like kubelet's flag of the same name (e.g. `kernel.msg*,net.core.somaxconn`).
    /// SysctlPolicy objects add to it.
    #[arg(long, env = "ALLOWED_UNSAFE_SYSCTLS", value_delimiter = ',', value_parser = check::parse_pattern)]
    pub allowed_unsafe_sysctls: Vec<String>,

    /// Kernel release to gate the safe sysctls by, instead of /proc/sys/kernel/osrelease
    /// (for tests and for agents that can not read the host's /proc).
    #[arg(long, env = "KERNEL_VERSION", value_parser = check::parse_kernel_version)]
    pub kernel_version: Option<KernelVersion>,
}
