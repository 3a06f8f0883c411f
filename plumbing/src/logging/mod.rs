//! The logs both binaries write, in Kubernetes' formats.
//!
//! - `klog.rs`: klog's text and component-base's JSON as tracing-subscriber formatters, and
//!   `KObj`, an object reference written as both write one.
//! - `telemetry.rs`: the logging flags (`--log-format`, `--log-level`, `-v`), the subscriber
//!   they install, logfmt, and `joined`, a list written as one field.

pub mod klog;
#[cfg(test)]
mod klog_tests;
pub mod telemetry;
