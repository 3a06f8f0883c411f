//! node-agent: per-node housekeeping (stale UDP conntrack entries, sysctl reports).

pub mod agent;
pub mod conntrack;
pub mod context;
pub mod sysctlreport;
