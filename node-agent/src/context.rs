//! What every node-agent task is handed: the process's client, metrics registry, readiness,
//! dry-run switch and cancellation token (plumbing's `Base`), and the Node it runs on.

use groundskeeper_plumbing::{
    events::{Events, Reporter},
    process::Base,
};

/// Field manager and Event reporter of every node-agent write.
pub const MANAGER: &str = "groundskeeper-node-agent";

/// Built once by `main`; a task depends on this type, never on the agent's wiring.
#[derive(Clone)]
pub struct Context {
    pub base: Base,
    /// The Node this agent runs on (from the downward API).
    pub node_name: String,
}

impl Context {
    /// The Events a task records: the agent's, from this node; only logged under `--dry-run`.
    pub fn events(&self) -> Events {
        Events::new(
            self.base.client.clone(),
            Reporter::on(MANAGER, &self.node_name),
            self.base.dry_run,
        )
    }
}
