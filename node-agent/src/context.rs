//! What every node-agent task is handed: the process's client, metrics registry, readiness,
//! dry-run switch and cancellation token (plumbing's `Base`), and the Node it runs on.

use groundskeeper_plumbing::{
    events::{Events, Reporter},
    process::Base,
};

/// Field manager of every node-agent write.
pub const MANAGER: &str = "groundskeeper-node-agent";

/// The reporting controllers of the tasks' Events (`plumbing::events::REPORTING_DOMAIN`'s
/// scheme: the task as `--tasks` names it).
pub const CONNTRACK_REPORTER: &str = "groundskeeper.dev/conntrack";
pub const SYSCTL_REPORTER: &str = "groundskeeper.dev/sysctl";

/// Built once by `main`; a task depends on this type, never on the agent's wiring.
#[derive(Clone)]
pub struct Context {
    pub base: Base,
    /// The Node this agent runs on (from the downward API).
    pub node_name: String,
}

impl Context {
    /// The Events a task records, reported by `reporter` from this node (the reporting instance
    /// is the node's name, as kubelet's Events); only logged under `--dry-run`.
    pub fn events(&self, reporter: &str) -> Events {
        Events::new(
            self.base.client.clone(),
            Reporter::on(reporter, &self.node_name),
            self.base.dry_run,
        )
    }
}
