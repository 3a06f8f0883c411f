//! The one primitive every component watches with: a kind watched into a map of what the
//! component keeps of each object, a relist buffered and swapped in whole, each event handed on
//! only after the map has applied it, and the watch's health in a flag named `component/kind`.
//!
//! Why buffer and swap (kube-runtime's `reflector::store::Writer`, client-go's `Replace`): a
//! reader never sees half a list, and what was deleted while the watch was down disappears at
//! the swap, all at once, instead of lingering as a ghost the component would act on.
//!
//! Why a projection: the components keep a few fields of each object (PodGC about 100 bytes of
//! a 4-10 KiB pod), so the map holds what the component's `decide` reads, not the wire object.
//!
//! Whether what the cache shows may be acted on is [`Health`]'s to say, for every component.

use std::{
    collections::{HashMap, HashSet},
    fmt::Debug,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard},
};

use futures::{Stream, StreamExt};
use kube::{
    Api, Resource,
    runtime::watcher::{self, Event},
};
use serde::de::DeserializeOwned;

use crate::{Readiness, ReadyFlag};

#[cfg(test)]
mod follow_tests;
mod health;
#[cfg(test)]
mod health_tests;
#[cfg(test)]
mod store_tests;
pub use health::{Health, Seen, Stale};

/// One watched kind, as the component keeps it: `V` per key `K`.
pub struct Store<K, V> {
    live: HashMap<K, V>,
    relist: Relist<K, V>,
    listed: bool,
}

/// How a relist reaches the store.
enum Relist<K, V> {
    /// Buffered into a new map, swapped in whole at `InitDone` (the default).
    Buffered(Option<HashMap<K, V>>),
    /// Applied page by page into the live map, each key marked; at `InitDone` whatever was not
    /// marked is swept ([`Store::relisting_in_place`]). `None` outside a relist.
    InPlace(Option<HashSet<K>>),
}

impl<K: Eq + Hash, V> Default for Store<K, V> {
    fn default() -> Self {
        Self {
            live: HashMap::new(),
            relist: Relist::Buffered(None),
            listed: false,
        }
    }
}

impl<K: Eq + Hash, V> Store<K, V> {
    /// A store that applies a relist in place instead of buffering it: never two full maps at
    /// once (at PodGC's 150k pods the second map is tens of MiB for the length of a relist). A
    /// value replaced or removed is dropped as soon as the relist reaches it, and an unchanged
    /// key keeps its allocation. The price: between `Init` and `InitDone` readers see a mix of the
    /// old and the new list (objects deleted meanwhile still there, updated ones already
    /// changed). Only for a store whose readers act on it through [`Health`], which answers
    /// `NotHealthy` from `Init` until the list has been folded in; `InitDone` then sweeps what
    /// the list no longer has, so the store equals one built from that list alone.
    pub fn relisting_in_place() -> Self {
        Self {
            relist: Relist::InPlace(None),
            ..Self::default()
        }
    }
}

/// A watch event reduced to a key and what is kept.
#[derive(Debug)]
pub enum Update<K, V> {
    Init,
    InitApply(K, V),
    InitDone,
    Apply(K, V),
    Delete(K),
}

/// What the projection makes of one object: kept (its facts, under its key), not kept, or
/// not keyable.
pub enum Projected<K, V> {
    /// Kept under this key.
    Yes(K, V),
    /// Not kept (it does not concern the component): an update that makes a kept object
    /// uninteresting removes it, as a delete would.
    No(K),
    /// The object cannot be keyed (no name): the event is dropped.
    Unusable,
}

impl<K, V> Update<K, V> {
    /// The event as the store takes it, `None` when there is nothing to take.
    pub fn from_event<W>(
        ev: Event<W>,
        mut project: impl FnMut(W) -> Projected<K, V>,
    ) -> Option<Self> {
        Some(match ev {
            Event::Init => Update::Init,
            Event::InitDone => Update::InitDone,
            Event::InitApply(w) => match project(w) {
                Projected::Yes(k, v) => Update::InitApply(k, v),
                Projected::No(_) | Projected::Unusable => return None,
            },
            Event::Apply(w) => match project(w) {
                Projected::Yes(k, v) => Update::Apply(k, v),
                Projected::No(k) => Update::Delete(k),
                Projected::Unusable => return None,
            },
            Event::Delete(w) => match project(w) {
                Projected::Yes(k, _) | Projected::No(k) => Update::Delete(k),
                Projected::Unusable => return None,
            },
        })
    }
}

/// What an update did to the store, for a component that reacts to changes.
#[derive(Debug)]
pub enum Applied<K, V> {
    /// Nothing visible yet (a relist is being buffered), or a delete of an unknown key.
    Nothing,
    /// `key` now holds the new value; `old` is what it replaced.
    Upserted { key: K, old: Option<V> },
    /// `key` was removed; it held `old`.
    Removed { key: K, old: V },
    /// A full list was swapped in; `old` is the map it replaced (keys missing from the new
    /// list were deleted while the watch was down). In a store relisting in place, each listed
    /// object was already `Upserted`, and `old` holds only what the list no longer has.
    Relisted { old: HashMap<K, V> },
}

impl<K: Eq + Hash, V: PartialEq> PartialEq for Applied<K, V> {
    fn eq(&self, other: &Self) -> bool {
        use Applied::*;
        match (self, other) {
            (Nothing, Nothing) => true,
            (Upserted { key: a, old: x }, Upserted { key: b, old: y }) => a == b && x == y,
            (Removed { key: a, old: x }, Removed { key: b, old: y }) => a == b && x == y,
            (Relisted { old: x }, Relisted { old: y }) => x == y,
            _ => false,
        }
    }
}

impl<K, V> Applied<K, V> {
    pub fn is_relisted(&self) -> bool {
        matches!(self, Applied::Relisted { .. })
    }
}

impl<K: Eq + Hash + Clone, V> Store<K, V> {
    pub fn apply(&mut self, u: Update<K, V>) -> Applied<K, V> {
        match (u, &mut self.relist) {
            (Update::Init, Relist::Buffered(relist)) => {
                *relist = Some(HashMap::new());
                Applied::Nothing
            }
            (Update::InitApply(k, v), Relist::Buffered(relist)) => {
                relist.get_or_insert_with(HashMap::new).insert(k, v);
                Applied::Nothing
            }
            (Update::InitDone, Relist::Buffered(relist)) => {
                let mut new = relist.take().unwrap_or_default();
                new.shrink_to_fit();
                self.listed = true;
                Applied::Relisted {
                    old: std::mem::replace(&mut self.live, new),
                }
            }
            (Update::Init, Relist::InPlace(marks)) => {
                *marks = Some(HashSet::with_capacity(self.live.len()));
                Applied::Nothing
            }
            (Update::InitApply(k, v), Relist::InPlace(marks)) => {
                // An existing key keeps its allocation (the mark shares it); the old value is
                // dropped here.
                let old = self.live.insert(k.clone(), v);
                if let Some((kept, _)) = self.live.get_key_value(&k) {
                    marks.get_or_insert_with(HashSet::new).insert(kept.clone());
                }
                Applied::Upserted { key: k, old }
            }
            (Update::InitDone, Relist::InPlace(marks)) => {
                let marks = marks.take().unwrap_or_default();
                let gone: Vec<K> = self
                    .live
                    .keys()
                    .filter(|k| !marks.contains(*k))
                    .cloned()
                    .collect();
                let old = gone
                    .into_iter()
                    .filter_map(|k| self.live.remove_entry(&k))
                    .collect();
                // Shrunk only when mostly empty: a rehash holds two tables at once.
                if self.live.len() * 4 < self.live.capacity() {
                    self.live.shrink_to_fit();
                }
                self.listed = true;
                Applied::Relisted { old }
            }
            (Update::Apply(k, v), _) => {
                let old = self.live.insert(k.clone(), v);
                Applied::Upserted { key: k, old }
            }
            (Update::Delete(k), _) => match self.live.remove(&k) {
                Some(old) => Applied::Removed { key: k, old },
                None => Applied::Nothing,
            },
        }
    }

    /// Projects `ev` and applies it.
    pub fn apply_event<W>(
        &mut self,
        ev: Event<W>,
        project: impl FnMut(W) -> Projected<K, V>,
    ) -> Applied<K, V> {
        match Update::from_event(ev, project) {
            Some(u) => self.apply(u),
            None => Applied::Nothing,
        }
    }

    /// A full list has been applied at least once.
    pub fn listed(&self) -> bool {
        self.listed
    }

    pub fn get(&self, k: &K) -> Option<&V> {
        self.live.get(k)
    }

    pub fn contains(&self, k: &K) -> bool {
        self.live.contains_key(k)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.live.keys()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.live.values()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.live.iter()
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

/// A component's cache, shared between its watch streams and its readers.
pub struct Shared<C>(Arc<Mutex<C>>);

impl<C> Clone for Shared<C> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<C: Default> Default for Shared<C> {
    fn default() -> Self {
        Self::new(C::default())
    }
}

impl<C> Shared<C> {
    pub fn new(c: C) -> Self {
        Self(Arc::new(Mutex::new(c)))
    }

    /// The cache, for a short read or write. A panic while it was held leaves the cache as the
    /// last fold left it, which is as good as any: the lock is taken over, not poisoned for ever.
    pub fn lock(&self) -> MutexGuard<'_, C> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Watches every `W` (cluster-wide, narrowed by `config`'s selectors) into `cache` for ever
/// through `crate::watch::stream::watch` (capped backoff, relist after errors and after a
/// silence, errors logged and counted there). `fold` applies each event to the cache under
/// its lock and says what the component must react to; the stream yields that after the lock
/// is released. The watch's flag, registered as `component/kind` (`podgc/pods`), is returned
/// with the stream and turns healthy as soon as a full list has been folded in.
pub fn follow<W, C, R, F>(
    readiness: &Readiness,
    component: &str,
    client: kube::Client,
    config: watcher::Config,
    cache: Shared<C>,
    fold: F,
) -> (
    ReadyFlag,
    impl Stream<Item = R> + Send + 'static + use<W, C, R, F>,
)
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    W::DynamicType: Default,
    C: Send + 'static,
    R: Send + 'static,
    F: FnMut(&mut C, Event<W>) -> R + Send + 'static,
{
    follow_in(
        readiness,
        component,
        client,
        |c| Api::all_with(c, &W::DynamicType::default()),
        config,
        cache,
        fold,
    )
}

/// [`follow`] with the watch's scope chosen by `scope` (e.g. `|c| Api::namespaced(c, ns)` for a
/// component whose RBAC covers one namespace).
pub fn follow_in<W, C, R, F, S>(
    readiness: &Readiness,
    component: &str,
    client: kube::Client,
    scope: S,
    config: watcher::Config,
    cache: Shared<C>,
    mut fold: F,
) -> (
    ReadyFlag,
    impl Stream<Item = R> + Send + 'static + use<W, C, R, F, S>,
)
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    W::DynamicType: Default,
    C: Send + 'static,
    R: Send + 'static,
    F: FnMut(&mut C, Event<W>) -> R + Send + 'static,
    S: FnOnce(kube::Client) -> Api<W>,
{
    let kind = W::plural(&W::DynamicType::default()).into_owned();
    let flag = readiness.register(format!("{component}/{kind}"));
    let events = super::stream::watch(client, scope, config, flag.clone());
    let ready = flag.clone();
    let mut first = true;
    let stream = events.filter_map(move |ev| {
        // plumbing::watch logs, counts and retries errors; it never yields one.
        let out = ev.ok().map(|ev| {
            let listed = matches!(ev, Event::InitDone);
            let out = fold(&mut cache.lock(), ev);
            if listed {
                // Folded in: the cache is current, before the component reacts to it.
                ready.mark_ready();
                if std::mem::take(&mut first) {
                    tracing::info!(watch = %ready.name(), "cache listed");
                }
            }
            out
        });
        std::future::ready(out)
    });
    (flag, stream)
}

/// The watches of one component into its one cache: each kind listed cluster-wide (narrowed by
/// its config's selectors), its flag named `component/kind`. Built once per component, so the
/// calls name only what differs: the selectors and the fold.
pub struct Watches<C> {
    readiness: Readiness,
    component: &'static str,
    client: kube::Client,
    cache: Shared<C>,
}

impl<C: Send + 'static> Watches<C> {
    pub fn new(
        readiness: &Readiness,
        component: &'static str,
        client: &kube::Client,
        cache: &Shared<C>,
    ) -> Self {
        Self {
            readiness: readiness.clone(),
            component,
            client: client.clone(),
            cache: cache.clone(),
        }
    }

    /// [`follow`] every `W` that `config` selects.
    pub fn follow<W, R, F>(
        &self,
        config: watcher::Config,
        fold: F,
    ) -> (
        ReadyFlag,
        impl Stream<Item = R> + Send + 'static + use<W, R, F, C>,
    )
    where
        W: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        R: Send + 'static,
        F: FnMut(&mut C, Event<W>) -> R + Send + 'static,
    {
        follow(
            &self.readiness,
            self.component,
            self.client.clone(),
            config,
            self.cache.clone(),
            fold,
        )
    }
}
