//! What every controller is handed: the process's client, metrics registry, readiness, dry-run
//! switch and cancellation token (plumbing's `Base`), and the leadership gate.

use groundskeeper_plumbing::process::Base;
use kube::runtime::events::Reporter;

use crate::leader::Leadership;

/// Built once by `main`; a controller depends on this type, never on the manager's wiring.
#[derive(Clone)]
pub struct Context {
    pub base: Base,
    pub leadership: Leadership,
}

impl Context {
    /// Who reports the Events a controller writes: `controller` from this replica (the pod's
    /// name from the downward API, when the chart sets `POD_NAME`).
    pub fn reporter(&self, controller: &str) -> Reporter {
        Reporter {
            controller: controller.into(),
            instance: std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()),
        }
    }
}
