//! Our writes and a lagging pod cache: over generated sequences of admin writes, PodGC
//! writes, late watch events and relists, no snapshot shows a pod older than a write of ours to
//! it, and once the cache has caught up nothing is held back.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use kube::runtime::watcher::Event;
use serde_json::json;
use testkit::{api::Mock, rng::Rng};
use tokio_util::sync::CancellationToken;

use groundskeeper_plumbing::watch::cache::Shared;

use super::{
    apply::{Applier, KubeWrites},
    cache::Caches,
    cycle::Cycle,
    decide::{Mode, Sweep},
    metrics::Metrics,
    notice::Reported,
    quarantine::Quarantine,
    wire::WirePod,
};

fn wire(name: &str, uid: &str, version: u64, phase: &str) -> WirePod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid,
            "resourceVersion": version.to_string(),
            "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": "n1"}, "status": {"phase": phase}
    }))
    .unwrap()
}

/// The apiserver's pods: name → (uid, version, phase).
type Server = HashMap<String, (String, u64, &'static str)>;

#[test]
fn no_snapshot_shows_a_pod_older_than_our_write_to_it() {
    for seed in 0..300u64 {
        let mut rng = Rng(seed);
        let mut server: Server = HashMap::new();
        let mut rv = 1u64;
        let mut queue: VecDeque<Event<WirePod>> = VecDeque::new();
        let mut caches = Caches::default();
        caches.fold_pod(Event::Init);
        caches.fold_pod(Event::InitDone);
        // What the cache folded last per name: (uid, version).
        let mut folded: HashMap<String, (String, u64)> = HashMap::new();
        // Our writes: (name, uid) → the version answered (None: gone by our 404).
        let mut ours: HashMap<(String, String), Option<u64>> = HashMap::new();
        let mut uids = 0;
        for step in 0..120 {
            let names = ["a", "b", "c", "d"];
            let name = rng.pick(&names).to_string();
            match rng.below(7) {
                // The admin creates or updates a pod.
                0 | 1 => {
                    rv += 1;
                    let uid = match server.get(&name) {
                        Some((uid, ..)) => uid.clone(),
                        None => {
                            uids += 1;
                            format!("u{uids}")
                        }
                    };
                    let phase = rng.pick(&["Running", "Succeeded"]);
                    server.insert(name.clone(), (uid.clone(), rv, phase));
                    queue.push_back(Event::Apply(wire(&name, &uid, rv, phase)));
                }
                // PodGC writes to a pod of its snapshot: a delete, a status patch, or a 404.
                2 | 3 => {
                    let snap = caches.snapshot();
                    let Some(pod) = snap.pods.iter().find(|p| p.name() == name) else {
                        continue;
                    };
                    let uid = pod.uid.to_string();
                    let live = server.get(&name).filter(|(u, ..)| *u == uid).cloned();
                    let answered = match live {
                        None => None,
                        Some(_) if rng.chance(50) => {
                            rv += 1;
                            server.remove(&name);
                            queue.push_back(Event::Delete(wire(&name, &uid, rv, "Failed")));
                            Some(rv)
                        }
                        Some(_) => {
                            rv += 1;
                            server.insert(name.clone(), (uid.clone(), rv, "Failed"));
                            queue.push_back(Event::Apply(wire(&name, &uid, rv, "Failed")));
                            Some(rv)
                        }
                    };
                    caches.wrote(pod, answered);
                    ours.insert((name.clone(), uid), answered);
                }
                // Late watch events arrive.
                4 | 5 => {
                    for _ in 0..rng.below(3) {
                        let Some(ev) = queue.pop_front() else { break };
                        match &ev {
                            Event::Apply(p) => {
                                let m = &p.metadata;
                                let v = m.resource_version.as_ref().unwrap().parse().unwrap();
                                folded.insert(m.name.clone().unwrap(), (m.uid.clone().unwrap(), v));
                            }
                            Event::Delete(p) => {
                                folded.remove(p.metadata.name.as_ref().unwrap());
                            }
                            _ => {}
                        }
                        caches.fold_pod(ev);
                    }
                }
                // The watch breaks: events in flight are lost, a consistent relist follows.
                _ => {
                    queue.clear();
                    folded.clear();
                    caches.fold_pod(Event::Init);
                    for (name, (uid, v, phase)) in &server {
                        caches.fold_pod(Event::InitApply(wire(name, uid, *v, phase)));
                        folded.insert(name.clone(), (uid.clone(), *v));
                    }
                    caches.fold_pod(Event::InitDone);
                }
            }
            for p in caches.snapshot().pods {
                let key = (p.name().to_string(), p.uid.to_string());
                let Some(wrote) = ours.get(&key) else {
                    continue;
                };
                let seen = folded.get(&key.0).filter(|(u, _)| *u == key.1).map(|f| f.1);
                match wrote {
                    Some(w) => assert!(
                        seen.is_some_and(|s| s >= *w),
                        "seed {seed} step {step}: {key:?} shown at {seen:?}, our write was at {w}"
                    ),
                    None => {
                        panic!("seed {seed} step {step}: {key:?} shown after a 404 said it is gone")
                    }
                }
            }
        }
        // Caught up: the cache is the server, and nothing is held back.
        while let Some(ev) = queue.pop_front() {
            caches.fold_pod(ev);
        }
        let mut shown: Vec<(String, String)> = caches
            .snapshot()
            .pods
            .iter()
            .map(|p| (p.name().to_string(), p.uid.to_string()))
            .collect();
        shown.sort();
        let mut want: Vec<(String, String)> = server
            .iter()
            .map(|(n, (u, ..))| (n.clone(), u.clone()))
            .collect();
        want.sort();
        assert_eq!(
            shown, want,
            "seed {seed}: caught up, every pod is judged again"
        );
        assert!(
            caches.pending.is_empty(),
            "seed {seed}: {:?}",
            caches.pending
        );
    }
}

/// A pod deleted in one cycle and still in the cache at the next is neither counted toward the
/// threshold nor sent anything again; once its DELETED event is folded, it is gone for good.
#[tokio::test]
async fn a_pod_deleted_last_cycle_is_not_judged_again_on_a_stale_cache() {
    let caches = Shared::new(Caches::default());
    {
        let mut c = caches.lock();
        c.fold_pod(Event::Init);
        for (i, name) in ["old1", "old2", "new1", "new2"].iter().enumerate() {
            let mut p = wire(name, &format!("u-{name}"), 10 + i as u64, "Succeeded");
            p.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    format!("2026-01-0{}T00:00:00Z", i + 1).parse().unwrap(),
                ));
            c.fold_pod(Event::InitApply(p));
        }
        c.fold_pod(Event::InitDone);
    }
    let mock = Mock::default();
    let mut cycle = Cycle {
        client: mock.client(),
        applier: Applier {
            live: Some(caches.clone()),
            ..Applier::new(
                Arc::new(KubeWrites::new(mock.client())),
                Metrics::register(&prometheus::Registry::new()).unwrap(),
                4,
                false,
                CancellationToken::new(),
                crate::leader::Fence::unbounded(),
            )
        },
        quarantine: Quarantine::new(Duration::from_secs(3600)),
        mode: Mode::All,
        threshold: 2,
        ttl: None,
        reported: Reported::default(),
        events: groundskeeper_plumbing::events::Events::new(
            mock.client(),
            groundskeeper_plumbing::events::Reporter::on("test", "test"),
            false,
        ),
    };
    cycle.run(&caches).await;
    let mut calls = mock.calls();
    calls.sort();
    assert_eq!(
        calls,
        [
            "DELETE /api/v1/namespaces/ns/pods/old1",
            "DELETE /api/v1/namespaces/ns/pods/old2"
        ]
    );
    assert_eq!(caches.lock().pending.len(), 2);

    // Next cycle, the DELETED events not in yet: 2 terminated pods judged, none over.
    let summary = cycle.run(&caches).await;
    assert_eq!(
        mock.calls().len(),
        2,
        "nothing sent again: {:?}",
        mock.calls()
    );
    assert_eq!(summary.passes[Sweep::Terminated as usize].chosen(), 0);

    caches
        .lock()
        .fold_pod(Event::Delete(wire("old1", "u-old1", 20, "Succeeded")));
    caches
        .lock()
        .fold_pod(Event::Delete(wire("old2", "u-old2", 21, "Succeeded")));
    assert!(caches.lock().pending.is_empty());
    cycle.run(&caches).await;
    assert_eq!(mock.calls().len(), 2, "{:?}", mock.calls());
}
