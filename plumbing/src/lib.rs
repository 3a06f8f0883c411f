//! What both groundskeeper binaries share, written once: logs, metrics, the admin HTTP server,
//! readiness and watch health, the one way to watch and cache what is watched, the shutdown
//! token and the Kubernetes client.
//!
//! The rooms, each a folder whose `mod.rs` says what its files hold:
//! - `watch/`: the one way to watch a kind and keep what is watched (`watch::cache`), the
//!   watch stream under it and how it lists, and each watch's flag, which the process's
//!   readiness adds up (`watch::readiness`).
//! - `client/`: the Kubernetes client, and the layers on each of its requests: the QPS budget
//!   and the token buckets (`client::ratelimit`), client-go's REST client metrics
//!   (`client::restclient`), the request deadline (`client::timeout`).
//! - `serving/`: HTTP served at a bounded cost to callers who may be hostile, and the admin
//!   server built of it (`serving::admin`: `/healthz`, `/readyz`, `/metrics`).
//! - `metrics_auth/`: who may read `/metrics`.
//! - `logging/`: the logs in Kubernetes' formats (`logging::klog`) and the flags and
//!   subscriber that choose one (`logging::telemetry`).
//! - `life/`: one runner for a component's life (`life::component`: listed, leading, its
//!   workers, its drain) and one for the process's (`life::stages`: drained in order).
//!
//! At the top, what has no room of its own: the start-up both binaries share (`process`), the
//! shutdown token (`shutdown`), the flag parsing (`cli`, `duration`), the Event writer
//! (`events`), an object's key (`key`), the Prometheus registry (`metrics`), and a bounded
//! least-recently-used map (`lru`).

pub mod cli;
pub mod client;
pub mod duration;
pub mod events;
#[cfg(test)]
mod events_tests;
pub mod key;
pub mod life;
pub mod logging;
pub mod lru;
pub mod metrics;
pub mod metrics_auth;
pub mod process;
pub mod serving;
pub mod shutdown;
pub mod watch;

pub use key::ObjectKey;
pub use shutdown::Shutdown;
pub use watch::readiness::{Readiness, ReadyFlag, WatchSettings};
