//! A map of bounded size that evicts its least recently used entry: the admin server's cache of
//! `/metrics` token answers, where whoever reaches the port chooses the keys (`docs/decisions.md`
//! says why it is not a crate).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

pub struct Lru<K, V> {
    entries: HashMap<K, (u64, V)>,
    /// Each entry's last use, oldest first.
    order: BTreeMap<u64, K>,
    tick: u64,
    cap: usize,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// Holds at most `cap` entries (at least one).
    pub fn new(cap: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            cap: cap.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of `key`, which counts as a use.
    pub fn get<Q>(&mut self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let tick = self.next();
        let (used, _) = self.entries.get_mut(key)?;
        let k = self
            .order
            .remove(used)
            .expect("every entry is in the order");
        *used = tick;
        self.order.insert(tick, k);
        self.entries.get(key).map(|(_, v)| v)
    }

    /// Sets `key`'s entry (a use); evicts the least recently used entry when full.
    pub fn put(&mut self, key: K, value: V) {
        let tick = self.next();
        if let Some((used, _)) = self.entries.remove(&key) {
            self.order.remove(&used);
        } else if self.entries.len() >= self.cap
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.entries.remove(&oldest);
        }
        self.order.insert(tick, key.clone());
        self.entries.insert(key, (tick, value));
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (used, v) = self.entries.remove(key)?;
        self.order.remove(&used);
        Some(v)
    }

    fn next(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut l = Lru::new(2);
        l.put("a", 1);
        l.put("b", 2);
        assert_eq!(l.get("a"), Some(&1), "a used after b");
        l.put("c", 3);
        assert_eq!(l.get("b"), None, "b was the least recently used");
        assert_eq!(l.get("a"), Some(&1));
        assert_eq!(l.get("c"), Some(&3));
        l.put("a", 10);
        assert_eq!(l.len(), 2, "a replaced, not added");
        assert_eq!(l.remove("c"), Some(3));
        assert_eq!(l.remove("c"), None);
        assert_eq!(l.len(), 1);
    }

    /// Against a plain model (a list, most recent last) over generated operations: the same
    /// entries, never more than the cap, and whatever is evicted is the least recently used.
    #[test]
    fn behaves_as_the_model() {
        let mut rng = testkit::rng::Rng(33);
        for cap in [1, 2, 3, 8] {
            let mut lru = Lru::new(cap);
            let mut model: Vec<(u32, u32)> = Vec::new();
            for step in 0..5000 {
                let key = rng.below(12) as u32;
                match rng.below(3) {
                    0 => {
                        let got = lru.get(&key).copied();
                        let want = model.iter().position(|(k, _)| *k == key).map(|i| {
                            let e = model.remove(i);
                            model.push(e);
                            e.1
                        });
                        assert_eq!(got, want, "cap {cap}, step {step}: get {key}");
                    }
                    1 => {
                        lru.put(key, step);
                        if let Some(i) = model.iter().position(|(k, _)| *k == key) {
                            model.remove(i);
                        } else if model.len() >= cap {
                            model.remove(0);
                        }
                        model.push((key, step));
                    }
                    _ => {
                        let got = lru.remove(&key);
                        let want = model
                            .iter()
                            .position(|(k, _)| *k == key)
                            .map(|i| model.remove(i).1);
                        assert_eq!(got, want, "cap {cap}, step {step}: remove {key}");
                    }
                }
                assert_eq!(lru.len(), model.len(), "cap {cap}, step {step}");
                assert!(lru.len() <= cap);
                assert_eq!(lru.order.len(), lru.entries.len());
            }
        }
    }
}
