//! What both groundskeeper binaries share, written once: logs, metrics, the admin HTTP server,
//! readiness and watch health, the one way to watch and cache what is watched, the shutdown
//! token and the Kubernetes client.

pub mod cli;
pub mod client;
pub mod duration;
pub mod events;
#[cfg(test)]
mod events_tests;
pub mod key;
pub mod logging;
pub mod lru;
pub mod metrics;
pub mod metrics_auth;
pub mod process;
pub mod serving;
pub mod shutdown;
pub mod tasks;
pub mod watch;

pub use key::ObjectKey;
pub use shutdown::Shutdown;
pub use watch::readiness::{Readiness, ReadyFlag, WatchSettings};
