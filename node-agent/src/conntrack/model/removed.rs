//! Which backends the agent saw stop serving a frontend or nodePort: the pass deletes a flow to
//! a backend that does not serve its key at once only when it saw that backend serve the key and
//! stop. A backend it never saw serve may be one the proxy already DNATs to while our
//! EndpointSlice watch lags behind: its flows wait the grace ([`crate::conntrack::decide::staleness`]).
//!
//! Kept outside the compared model (the live model and the whole rebuild stay as they were):
//! the round thread feeds it each model a round judges, in order, and it records what a key's
//! serving set lost between two of them.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::conntrack::model::FamilyModel;

/// How long a removal is remembered (as long as a deleted frontend's tombstone).
pub const RETENTION: Duration = Duration::from_secs(600);

/// A key flows are judged by: a frontend (`IP:port`) or a nodePort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    Frontend(SocketAddr),
    NodePort(u16),
}

/// Backends seen to stop serving a key within the retention, per family.
#[derive(Debug, Clone, Default)]
pub struct Removed {
    /// (key, backend) -> when it was last seen removed.
    at: HashMap<(Key, SocketAddr), Instant>,
    /// The same removals in the order they were seen (expiry without a scan).
    queue: VecDeque<(Instant, Key, SocketAddr)>,
    /// Tests of other rules (streaming, focus) judge as if every backend had been seen removed.
    #[cfg(test)]
    pub all: bool,
}

impl Removed {
    /// Whether `backend` was seen serving `key` and then stop, within the retention.
    pub fn saw(&self, key: Key, backend: SocketAddr) -> bool {
        #[cfg(test)]
        if self.all {
            return true;
        }
        self.at.contains_key(&(key, backend))
    }

    /// Records what each key's serving set lost from `old` to `new` (everything of a key no
    /// longer live), seen at `now`; forgets the removal of every backend `new` shows serving its
    /// key again, and removals older than the retention.
    ///
    /// A backend back (a pod whose readiness flaps keeps its IP) is a live endpoint again: only a
    /// removal seen after that may delete its flows at once, never the one before it.
    pub fn observe(&mut self, old: &FamilyModel, new: &FamilyModel, now: Instant) {
        let serving_frontends = new.frontends.iter().map(|(k, s)| (Key::Frontend(*k), s));
        let serving_ports = new.node_ports.iter().map(|(p, s)| (Key::NodePort(*p), s));
        for (key, serving) in serving_frontends.chain(serving_ports) {
            for b in serving {
                self.at.remove(&(key, *b));
            }
        }
        let none = super::Addrs::default();
        let frontends = old.frontends.iter().map(|(k, was)| {
            (
                Key::Frontend(*k),
                was,
                new.frontends.get(k).unwrap_or(&none),
            )
        });
        let node_ports = old.node_ports.iter().map(|(p, was)| {
            (
                Key::NodePort(*p),
                was,
                new.node_ports.get(p).unwrap_or(&none),
            )
        });
        for (key, was, now_serving) in frontends.chain(node_ports) {
            for b in was.difference(now_serving) {
                self.at.insert((key, *b), now);
                self.queue.push_back((now, key, *b));
            }
        }
        self.expire(now);
    }

    /// Forgets removals older than the retention.
    pub fn expire(&mut self, now: Instant) {
        while let Some(&(t, key, b)) = self.queue.front() {
            if now.saturating_duration_since(t) < RETENTION {
                break;
            }
            self.queue.pop_front();
            // Seen removed again later: that later sighting keeps it (one seen serving again
            // is gone from `at` already).
            if self.at.get(&(key, b)) == Some(&t) {
                self.at.remove(&(key, b));
            }
        }
    }

    /// Remembered removals (for tests and the log).
    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// For tests of other rules: every backend counts as seen removed.
    #[cfg(test)]
    pub fn everything() -> Self {
        Self {
            all: true,
            ..Self::default()
        }
    }
}
