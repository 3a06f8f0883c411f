//! Watching the apiserver, and keeping what is watched: the one way every component watches a
//! kind, and how healthy each watch is.
//!
//! - `cache.rs` (and `cache/`): what components watch with, `Watches::follow` into a `Store` of
//!   their projection in one `Shared` cache, and `Health`, whether what the cache shows may be
//!   acted on.
//! - `stream.rs`: the watch under every cache: kube-runtime's `watcher` with a capped backoff,
//!   a relist after every error, unanswered lists asked again and silent watches cut.
//! - `list.rs`: how a watch lists, streamed (WatchList) or in pages (`--watch-list`), and the
//!   fallback from one to the other.
//! - `readiness.rs`: one flag per watch (`component/kind`), the watch settings they carry, and
//!   the process's readiness (`/readyz`) they add up to.
//!
//! They import each other one way: the cache over the stream, the stream over its lists, all
//! of them over the flags.

pub mod cache;
pub mod list;
pub mod readiness;
pub mod stream;
#[cfg(test)]
mod stream_tests;
