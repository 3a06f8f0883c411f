//! Our pod writes the cache has not caught up with: a pod PodGC patched or deleted is not
//! judged again (chosen, counted toward a threshold, patched or deleted) until the pod cache
//! has folded that write, by resourceVersion, or the pod has left the cache.
//!
//! A delete answered 200 is not in the cache yet: the watch event is on its way. A pass that
//! judged the cache meanwhile would count the pod toward `--terminated-pod-gc-threshold` again
//! (and delete a pod it should keep) and send it the same writes again. The rule: a write the
//! apiserver answered at version `v` is settled by a pod event for that name at `v` or later
//! (a watch delivers a pod's events in order, so the write's own event is then folded), by an
//! event of another pod under the name, or by the pod leaving the cache (its DELETED event, or
//! a relist without it). A write whose version is unknown (a delete answered with a bare
//! Status, or a 404 saying the pod is gone already) settles only by the pod leaving.

use std::collections::HashMap;

use super::facts::{PodFacts, Uid};
use groundskeeper_plumbing::ObjectKey;

/// The resourceVersion a write left, as a number (etcd's revision); `None` when there is none
/// or it is not a number, which makes the write wait for the pod to leave the cache.
pub fn version(rv: Option<&str>) -> Option<u64> {
    rv?.parse().ok()
}

/// The write the cache must catch up with, per pod name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    uid: Uid,
    /// `None`: settled only by the pod leaving the cache.
    version: Option<u64>,
}

#[derive(Default, Debug)]
pub struct Pending {
    writes: HashMap<ObjectKey, Written>,
    /// The highest version a watch event folded into the pod cache: events come in version
    /// order, so every write answered at this version or below has been folded.
    progress: Option<u64>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Our write to `pod` was answered at `version`; `cached` says whether the cache still
    /// holds that pod (if not, it has left already and nothing is waited for). A later write
    /// of the same pod raises the version waited for; an unknown version waits for the pod to
    /// leave.
    pub fn record(&mut self, pod: &PodFacts, version: Option<u64>, cached: bool) {
        let folded = matches!((version, self.progress), (Some(v), Some(p)) if p >= v);
        if !cached || folded {
            return;
        }
        let w = self.writes.entry(pod.key.clone()).or_insert(Written {
            uid: pod.uid.clone(),
            version,
        });
        if w.uid != pod.uid {
            *w = Written {
                uid: pod.uid.clone(),
                version,
            };
            return;
        }
        w.version = match (w.version, version) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }

    /// A watch event was folded at `version`: every write at or below it is settled.
    pub fn advance(&mut self, version: u64) {
        if self.progress.is_some_and(|p| p >= version) {
            return;
        }
        self.progress = Some(version);
        self.writes
            .retain(|_, w| w.version.is_none_or(|wrote| wrote > version));
    }

    /// A pod under `key` was folded at `version` (an add, an update, a listed object): a write
    /// to another pod under that name, or at that version or before, is settled.
    pub fn folded(&mut self, key: &ObjectKey, uid: &Uid, version: Option<u64>) {
        let Some(w) = self.writes.get(key) else {
            return;
        };
        let caught_up = matches!((w.version, version), (Some(wrote), Some(seen)) if seen >= wrote);
        if w.uid != *uid || caught_up {
            self.writes.remove(key);
        }
    }

    /// The pod under `key` left the cache.
    pub fn gone(&mut self, key: &ObjectKey) {
        self.writes.remove(key);
    }

    /// After a relist: what the cache no longer has is settled.
    pub fn retain_cached(&mut self, cached: impl Fn(&ObjectKey, &Uid) -> bool) {
        self.writes.retain(|k, w| cached(k, &w.uid));
    }

    /// Whether the cache's `pod` may be older than a write of ours to it: not to be judged.
    pub fn holds(&self, pod: &PodFacts) -> bool {
        self.writes.get(&pod.key).is_some_and(|w| w.uid == pod.uid)
    }
}
