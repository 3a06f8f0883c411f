//! The in-place relist ([`Store::relisting_in_place`]) against the buffered one, over
//! generated worlds: whatever the store held and whatever changed while the watch was down
//! (objects deleted, changed, added), the store after a paged relist in place equals a store
//! built from scratch from the same list, and reports as gone exactly what the list lacks.

use std::collections::HashMap;

use super::*;

/// xorshift64*: reproducible cases without a dependency; the seed is printed on failure.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

type Key = (std::sync::Arc<str>, std::sync::Arc<str>);

fn key(i: u64) -> Key {
    (format!("ns-{}", i % 7).into(), format!("pod-{i}").into())
}

/// A world: what the server holds, `key -> value`.
fn world(rng: &mut Rng, universe: u64) -> HashMap<Key, u32> {
    let mut w = HashMap::new();
    for i in 0..universe {
        if rng.below(3) > 0 {
            w.insert(key(i), rng.below(1000) as u32);
        }
    }
    w
}

/// `before`, changed while the watch was down: some objects deleted, some changed, some added.
fn after_gap(rng: &mut Rng, before: &HashMap<Key, u32>, universe: u64) -> HashMap<Key, u32> {
    let mut after = HashMap::new();
    for (k, v) in before {
        if rng.below(4) > 0 {
            after.insert(k.clone(), if rng.below(3) == 0 { v + 1 } else { *v });
        }
    }
    for i in 0..universe {
        if rng.below(6) == 0 {
            after.entry(key(i)).or_insert(rng.below(1000) as u32);
        }
    }
    after
}

/// The list as the server pages it: every object once, in some order.
fn listed(rng: &mut Rng, world: &HashMap<Key, u32>) -> Vec<(Key, u32)> {
    let mut items: Vec<_> = world.iter().map(|(k, v)| (k.clone(), *v)).collect();
    for i in (1..items.len()).rev() {
        items.swap(i, rng.below(i as u64 + 1) as usize);
    }
    items
}

fn relist(store: &mut Store<Key, u32>, items: &[(Key, u32)]) -> Applied<Key, u32> {
    store.apply(Update::Init);
    for (k, v) in items {
        store.apply(Update::InitApply(k.clone(), *v));
    }
    store.apply(Update::InitDone)
}

fn contents(store: &Store<Key, u32>) -> HashMap<Key, u32> {
    store.iter().map(|(k, v)| (k.clone(), *v)).collect()
}

#[test]
fn a_relist_in_place_leaves_the_store_a_fresh_list_would_build() {
    let seed = 0x26_0026;
    let mut rng = Rng(seed);
    for case in 0..300 {
        let universe = 1 + rng.below(200);
        let before = world(&mut rng, universe);
        let mut in_place = Store::relisting_in_place();
        relist(&mut in_place, &listed(&mut rng, &before));
        // Some live events before the watch went down.
        let mut seen = before.clone();
        for _ in 0..rng.below(20) {
            let k = key(rng.below(universe));
            if rng.below(2) == 0 {
                let v = rng.below(1000) as u32;
                in_place.apply(Update::Apply(k.clone(), v));
                seen.insert(k, v);
            } else {
                in_place.apply(Update::Delete(k.clone()));
                seen.remove(&k);
            }
        }
        assert_eq!(contents(&in_place), seen, "seed {seed:#x} case {case}");

        let after = after_gap(&mut rng, &seen, universe);
        let items = listed(&mut rng, &after);
        let Applied::Relisted { old } = relist(&mut in_place, &items) else {
            panic!("seed {seed:#x} case {case}: not a relist");
        };
        let mut fresh = Store::default();
        relist(&mut fresh, &items);
        assert_eq!(
            contents(&in_place),
            contents(&fresh),
            "seed {seed:#x} case {case}: the store after the relist"
        );
        assert_eq!(contents(&in_place), after, "seed {seed:#x} case {case}");
        let gone: HashMap<Key, u32> = seen
            .into_iter()
            .filter(|(k, _)| !after.contains_key(k))
            .collect();
        assert_eq!(
            old, gone,
            "seed {seed:#x} case {case}: what the relist swept"
        );
        assert!(in_place.listed());
    }
}

/// A key the relist confirms keeps the allocation it had (no second copy of the keys is held
/// while relisting), and what the relist replaces is released before the relist ends.
#[test]
fn a_relist_in_place_keeps_confirmed_keys_and_releases_replaced_values_at_once() {
    let mut s: Store<Key, std::sync::Arc<u32>> = Store::relisting_in_place();
    let a = key(1);
    let old_value = std::sync::Arc::new(1);
    s.apply(Update::Init);
    s.apply(Update::InitApply(a.clone(), old_value.clone()));
    s.apply(Update::InitDone);
    s.apply(Update::Init);
    let fresh_key = key(1);
    assert!(!std::sync::Arc::ptr_eq(&fresh_key.1, &a.1));
    s.apply(Update::InitApply(fresh_key.clone(), std::sync::Arc::new(2)));
    assert_eq!(
        std::sync::Arc::strong_count(&old_value),
        1,
        "the replaced value is released mid-relist"
    );
    assert_eq!(
        std::sync::Arc::strong_count(&fresh_key.1),
        1,
        "the list's copy of a known key is not kept"
    );
    s.apply(Update::InitDone);
    let (kept, v) = s.iter().next().expect("a is kept");
    assert!(std::sync::Arc::ptr_eq(&kept.1, &a.1));
    assert_eq!(**v, 2);
}

/// While relisting in place the store shows the mix (that is why only health-checked readers
/// may use such a store); the sweep at `InitDone` removes what the list no longer has.
#[test]
fn mid_relist_the_store_shows_the_mix_until_the_sweep() {
    let mut s: Store<&str, u32> = Store::relisting_in_place();
    s.apply(Update::Init);
    s.apply(Update::InitApply("a", 1));
    s.apply(Update::InitApply("b", 1));
    s.apply(Update::InitDone);
    s.apply(Update::Init);
    assert_eq!(
        s.apply(Update::InitApply("b", 2)),
        Applied::Upserted {
            key: "b",
            old: Some(1)
        }
    );
    assert_eq!(s.get(&"a"), Some(&1), "not yet swept");
    assert_eq!(s.get(&"b"), Some(&2), "already changed");
    assert_eq!(
        s.apply(Update::InitDone),
        Applied::Relisted {
            old: HashMap::from([("a", 1)])
        }
    );
    assert_eq!(s.get(&"a"), None);
    assert_eq!(s.len(), 1);
}
