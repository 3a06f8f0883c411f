//! Readiness: a binary is ready once every watch it needs has completed its first list.
//! Leadership is deliberately not part of it: a standby replica is healthy and ready.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

/// A named watch and whether it has listed.
type Entry = (String, Arc<AtomicBool>);

#[derive(Clone, Default)]
pub struct Readiness {
    flags: Arc<Mutex<Vec<Entry>>>,
}

/// One watch's readiness; cheap to clone into the task that drives the watch.
#[derive(Clone)]
pub struct ReadyFlag(Arc<AtomicBool>);

impl ReadyFlag {
    pub fn mark_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl Readiness {
    /// Registers a watch that must list before the binary is ready.
    pub fn register(&self, name: impl Into<String>) -> ReadyFlag {
        let flag = Arc::new(AtomicBool::new(false));
        self.flags
            .lock()
            .expect("readiness lock")
            .push((name.into(), flag.clone()));
        ReadyFlag(flag)
    }

    /// Names of registered watches that have not listed yet; empty means ready.
    pub fn pending(&self) -> Vec<String> {
        self.flags
            .lock()
            .expect("readiness lock")
            .iter()
            .filter(|(_, f)| !f.load(Ordering::Acquire))
            .map(|(n, _)| n.clone())
            .collect()
    }

    pub fn is_ready(&self) -> bool {
        self.pending().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_watch_listed() {
        let r = Readiness::default();
        assert!(r.is_ready(), "nothing registered yet is vacuously ready");
        let pods = r.register("pods");
        let nodes = r.register("nodes");
        assert_eq!(r.pending(), vec!["pods", "nodes"]);
        pods.mark_ready();
        assert!(!r.is_ready());
        assert_eq!(r.pending(), vec!["nodes"]);
        nodes.mark_ready();
        assert!(r.is_ready());
    }
}
