//! The webhook's serving certificate: the Secret it is read from, the worker that serves it
//! (`worker.rs`) and, when the controller-manager issues its own certificates, the rotation it
//! takes (`rotation.rs`, `generation.rs`) and the caBundles it keeps equal to the Secret's CA.

pub mod apply;
pub mod cache;
pub mod generation;
pub mod metrics;
pub mod rotation;
#[cfg(test)]
mod rotation_tests;
pub mod worker;
