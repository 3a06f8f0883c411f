//! What every node-agent task is handed: the process's client, metrics registry, readiness,
//! dry-run switch and cancellation token (plumbing's `Base`), and the Node it runs on.

use groundskeeper_plumbing::process::Base;
use kube::runtime::events::Reporter;

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
    /// Who reports the Events a task writes: the agent, from this node.
    pub fn reporter(&self) -> Reporter {
        Reporter {
            controller: MANAGER.into(),
            instance: Some(self.node_name.clone()),
        }
    }
}
