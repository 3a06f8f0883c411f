//! The sysctl rules, written once for the node-agent (which reports what ran) and the
//! controller-manager's admission webhook (which keeps forbidden pods off nodes).
//!
//! Everything here is pure: kubelet's allowlist and messages (`allowlist`, `names`), the
//! kernel-gated safe list (`safe`, `kernel`), which kubelet version has which rules (`kubelet`),
//! kubelet's `defaultPodSysctls` judged for a node (`defaults`),
//! the SysctlPolicy resource (`crd`), a node's merged policy (`policy`), the verdict for one pod
//! on one node (`verdict`) and the hash whose values outlive a process (`hash`). The table both
//! binaries' decisions are tested against is `cases`, built only for tests (feature `testing`).

pub mod allowlist;
pub mod args;
#[cfg(any(test, feature = "testing"))]
pub mod cases;
pub mod crd;
pub mod defaults;
#[cfg(test)]
mod defaults_tests;
pub mod hash;
pub mod kernel;
pub mod kubelet;
#[cfg(test)]
mod kubelet_tests;
pub mod names;
pub mod policy;
pub mod safe;
pub mod verdict;
