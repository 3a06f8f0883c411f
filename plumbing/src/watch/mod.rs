//! Watching the apiserver: the one watch stream every cache is filled by.
//!
//! - `stream.rs`: kube-runtime's `watcher` with a capped backoff, a relist after every error,
//!   unanswered lists asked again and silent watches cut, its health kept in its flag.
//! - `list.rs`: how a watch lists, streamed (WatchList) or in pages (`--watch-list`), and the
//!   fallback from one to the other.

pub mod list;
pub mod stream;
#[cfg(test)]
mod stream_tests;
