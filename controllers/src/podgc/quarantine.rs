//! Orphan quarantine: how long a node missing from the cache waits before a live check.
//!
//! A missing node name waits `--orphan-quarantine` before it is checked with a live GET, like
//! upstream's delaying queue `orphaned_pods_nodes`. The clock is passed in, so tests drive it.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

pub struct Quarantine {
    delay: Duration,
    waiting: HashMap<Arc<str>, Instant>,
}

impl Quarantine {
    pub fn new(delay: Duration) -> Self {
        Self {
            delay,
            waiting: HashMap::new(),
        }
    }

    /// Queues a node name seen missing; true when it was not waiting yet. A name already
    /// waiting keeps its earliest ready time.
    pub fn observe(&mut self, node: &Arc<str>, now: Instant) -> bool {
        let ready_at = now + self.delay;
        let mut fresh = false;
        self.waiting
            .entry(node.clone())
            .and_modify(|t| *t = (*t).min(ready_at))
            .or_insert_with(|| {
                fresh = true;
                ready_at
            });
        fresh
    }

    /// Takes the names whose quarantine is over. Those the cache knows again are dropped
    /// without a check; the rest must be confirmed gone with a live GET. Sorted for stable logs.
    pub fn take_due(&mut self, now: Instant, in_cache: &HashSet<&str>) -> Vec<Arc<str>> {
        let mut due = Vec::new();
        self.waiting.retain(|name, ready_at| {
            if *ready_at > now {
                return true;
            }
            if !in_cache.contains(&**name) {
                due.push(name.clone());
            }
            false
        });
        due.sort();
        due
    }

    pub fn delay(&self) -> Duration {
        self.delay
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Duration = Duration::from_secs(40);

    fn name(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn due_only_after_the_quarantine() {
        let t0 = Instant::now();
        let mut q = Quarantine::new(Q);
        let none = HashSet::new();
        q.observe(&name("gone"), t0);
        assert!(q.take_due(t0, &none).is_empty());
        assert!(q.take_due(t0 + Duration::from_secs(39), &none).is_empty());
        assert_eq!(q.take_due(t0 + Q, &none), vec![name("gone")]);
        assert!(q.is_empty(), "taken names leave the queue");
        assert!(q.take_due(t0 + Q * 3, &none).is_empty());
    }

    #[test]
    fn re_observing_keeps_the_earliest_ready_time() {
        // The 20 s cycle re-adds the same name while it waits: that must not push it back.
        let t0 = Instant::now();
        let mut q = Quarantine::new(Q);
        let none = HashSet::new();
        assert!(q.observe(&name("gone"), t0));
        assert!(!q.observe(&name("gone"), t0 + Duration::from_secs(20)));
        assert_eq!(q.len(), 1);
        assert_eq!(q.take_due(t0 + Q, &none), vec![name("gone")]);
    }

    #[test]
    fn a_node_back_in_the_cache_is_dropped_without_a_check() {
        let t0 = Instant::now();
        let mut q = Quarantine::new(Q);
        q.observe(&name("back"), t0);
        q.observe(&name("gone"), t0);
        let cache = HashSet::from(["back"]);
        assert_eq!(q.take_due(t0 + Q, &cache), vec![name("gone")]);
        assert!(q.is_empty());
    }

    #[test]
    fn each_name_waits_its_own_time() {
        let t0 = Instant::now();
        let mut q = Quarantine::new(Q);
        let none = HashSet::new();
        q.observe(&name("b"), t0 + Duration::from_secs(10));
        q.observe(&name("a"), t0);
        assert_eq!(q.take_due(t0 + Q, &none), vec![name("a")]);
        assert_eq!(
            q.take_due(t0 + Q + Duration::from_secs(10), &none),
            vec![name("b")]
        );
    }

    #[test]
    fn zero_quarantine_is_due_at_once() {
        let t0 = Instant::now();
        let mut q = Quarantine::new(Duration::ZERO);
        q.observe(&name("gone"), t0);
        assert_eq!(q.take_due(t0, &HashSet::new()), vec![name("gone")]);
    }
}
