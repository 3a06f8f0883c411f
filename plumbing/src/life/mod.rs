//! How a binary and its components live: one runner each, so that no component wires its own
//! start, leadership wait or drain.
//!
//! - `component`: a component's [`Life`](component::Life): its watches from the start, its
//!   [`Crew`](component::Crew) of workers once it has listed and may act, its drain in order.
//! - `stages`: the process's [`Stages`](stages::Stages), each with its own token, drained one
//!   after another.
//! - `tasks`: the named long-running tasks of one stage, drained together.

pub mod component;
#[cfg(test)]
mod component_tests;
pub mod stages;
#[cfg(test)]
mod stages_tests;
pub mod tasks;
