//! What every controller is handed: the process's client, metrics registry, readiness, dry-run
//! switch and cancellation token (plumbing's `Base`), and the leadership gate.

use std::sync::Arc;

use groundskeeper_plumbing::{
    events::{Events, Reporter},
    life::component::Life,
    process::Base,
};

use crate::leader::Leadership;

/// Built once by `main`; a controller depends on this type, never on the manager's wiring.
#[derive(Clone)]
pub struct Context {
    pub base: Base,
    pub leadership: Leadership,
}

impl Context {
    /// The life of the controller `name`, which acts only while this replica leads: its watches
    /// fill on every replica, its workers start once they have listed and the lease is won, and
    /// it drains when the token is cancelled (plumbing's `life::component`).
    pub fn life(&self, name: &'static str) -> Life {
        let leadership = self.leadership.clone();
        Life::new(name, self.base.token.clone()).gated(async move { leadership.acquired().await })
    }

    /// The Events `controller` records from this replica (the pod's name from the downward
    /// API), fenced like its other writes; only logged under `--dry-run`.
    pub fn events(&self, controller: &str) -> Events {
        Events::new(
            self.base.client.clone(),
            Reporter::in_pod(controller),
            self.base.dry_run,
        )
        .fenced(Arc::new(self.leadership.fence()))
    }
}
