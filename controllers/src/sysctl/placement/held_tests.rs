//! Held pods cost little: a node joining or leaving writes nothing for the pods no node admits
//! unless it changes why (a new cause, or one gone); the numbers of nodes in their messages are
//! those of the last write. Through the placer, on its cache, with every write recorded.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::events::{Events, Recording, Reporter};
use groundskeeper_plumbing::watch::cache::{Health, Shared, Update};
use groundskeeper_sysctl_rules::args::PolicyArgs;
use groundskeeper_sysctl_rules::crd::{Mode, SysctlPolicy, SysctlPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use prometheus::Registry;
use serde_json::json;

use super::apply::{Apply, Writes};
use super::metrics::Metrics;
use super::worker::{Done, Worker};
use crate::sysctl::cache::SysctlCache;
use crate::sysctl::facts::{GATE, GatedPod, NodeFacts, PodFacts};
use crate::workqueue::{RateLimit, WorkQueue};

const HELD: usize = 200;
const SYSCTL: &str = "net.core.somaxconn";

#[derive(Clone, Default)]
struct Counted(Arc<Mutex<Vec<(ObjectKey, serde_json::Value)>>>);

impl Writes for Counted {
    async fn patch_pod(&self, _: &ObjectKey, _: &serde_json::Value) -> Result<(), kube::Error> {
        panic!("a held pod is never placed here")
    }
    async fn patch_status(
        &self,
        key: &ObjectKey,
        p: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        self.0.lock().unwrap().push((key.clone(), p.clone()));
        Ok(())
    }
}

fn node(pool: &str, kernel: &str) -> NodeFacts {
    NodeFacts {
        labels: [("pool".to_string(), pool.to_string())].into(),
        kernel: Some(kernel.into()),
        os: Some("linux".into()),
        kubelet: None,
    }
}

fn enforce(name: &str, pool: &str) -> SysctlPolicy {
    SysctlPolicy::new(
        name,
        SysctlPolicySpec {
            allowed_unsafe_sysctls: vec![],
            node_selector: Some(LabelSelector {
                match_labels: Some([("pool".to_string(), pool.to_string())].into()),
                ..Default::default()
            }),
            mode: Mode::Enforce,
        },
    )
}

fn gated(i: usize) -> GatedPod {
    let pod = serde_json::from_value(json!({
        "metadata": {"name": format!("p{i}"), "namespace": "team"},
        "spec": {"containers": [], "securityContext": {"sysctls": [{"name": SYSCTL, "value": "1"}]}}
    }))
    .unwrap();
    GatedPod {
        uid: format!("u{i}"),
        resource_version: "1".into(),
        facts: PodFacts::of(&pod),
        gates: vec![GATE.into()],
        ..Default::default()
    }
}

struct World {
    placer: Worker<Counted>,
    writes: Counted,
    events: Arc<Recording>,
}

impl World {
    fn new() -> Self {
        let writes = Counted::default();
        let events = Arc::new(Recording::default());
        let cache: Shared<SysctlCache> = Shared::default();
        {
            let mut c = cache.lock();
            c.policies.apply(Update::Apply(
                "enforce-web".into(),
                enforce("enforce-web", "web"),
            ));
            for n in ["w1", "w2"] {
                c.nodes.apply(Update::Apply(n.into(), node("web", "6.1.0")));
            }
            for i in 0..HELD {
                let key = ObjectKey::new("team", &format!("p{i}"));
                c.gated.apply(Update::Apply(key, gated(i)));
            }
        }
        let placer = Worker {
            policy: PolicyArgs {
                allowed_unsafe_sysctls: vec![],
                sysctl_default_mode: Mode::Enforce,
            },
            cache,
            health: Health::new([]),
            queue: WorkQueue::new(RateLimit::default()),
            apply: Apply::new(
                writes.clone(),
                false,
                Events::to(
                    events.clone(),
                    Reporter::on("sysctl-placement", "test"),
                    false,
                ),
            ),
            metrics: Metrics::register(&Registry::new()).unwrap(),
        };
        Self {
            placer,
            writes,
            events,
        }
    }

    /// Judges every gated pod (what a change of a Node or a SysctlPolicy queues), then folds
    /// each status patch back into the cache as the pod watch would: the status writes and the
    /// Events it took.
    async fn judge_all(&self) -> (usize, usize) {
        let keys: Vec<ObjectKey> = self.placer.cache.lock().gated.keys().cloned().collect();
        for k in &keys {
            let done = self.placer.evaluate(k).await.unwrap();
            assert!(matches!(done, Done::Held | Done::Nothing), "{k}: {done:?}");
        }
        let written = std::mem::take(&mut *self.writes.0.lock().unwrap());
        let mut c = self.placer.cache.lock();
        for (key, patch) in &written {
            let message = patch["status"]["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .to_string();
            let mut pod = c.gated.get(key).unwrap().clone();
            pod.held = Some(message);
            c.gated.apply(Update::Apply(key.clone(), pod));
        }
        (written.len(), self.events.take().len())
    }

    fn messages(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for g in self.placer.cache.lock().gated.values() {
            *out.entry(g.held.clone().unwrap_or_default()).or_default() += 1;
        }
        out
    }
}

#[tokio::test]
async fn nodes_that_only_move_the_numbers_cost_held_pods_no_write() {
    let w = World::new();
    assert_eq!(w.judge_all().await, (HELD, HELD), "each pod held once");
    assert_eq!(
        w.messages(),
        BTreeMap::from([(
            format!("no node admits {SYSCTL}: 2 nodes forbid it by SysctlPolicy enforce-web"),
            HELD
        )])
    );
    assert_eq!(w.judge_all().await, (0, 0), "nothing changed");

    // Nodes join and leave for the same cause: the numbers move, the causes do not.
    for (change, n) in [
        ("join", "w3"),
        ("join", "w4"),
        ("leave", "w1"),
        ("leave", "w3"),
    ] {
        {
            let mut c = w.placer.cache.lock();
            match change {
                "join" => c.nodes.apply(Update::Apply(n.into(), node("web", "6.1.0"))),
                _ => c.nodes.apply(Update::Delete(n.into())),
            };
        }
        assert_eq!(w.judge_all().await, (0, 0), "a node {change}s ({n})");
    }

    // A node for another cause joins: every held pod says so, once.
    w.placer
        .cache
        .lock()
        .nodes
        .apply(Update::Apply("x1".into(), node("other", "6.1.0")));
    assert_eq!(w.judge_all().await, (HELD, HELD), "a new cause");
    assert_eq!(
        w.messages(),
        BTreeMap::from([(
            format!(
                "no node admits {SYSCTL}: 2 nodes forbid it by SysctlPolicy enforce-web, 1 by the default mode Enforce (no SysctlPolicy selects them)"
            ),
            HELD
        )])
    );
    // More of them, and one of the first cause leaving: the same causes.
    {
        let mut c = w.placer.cache.lock();
        c.nodes
            .apply(Update::Apply("x2".into(), node("other", "6.1.0")));
        c.nodes
            .apply(Update::Apply("x3".into(), node("other", "6.1.0")));
        c.nodes.apply(Update::Delete("w2".into()));
    }
    assert_eq!(w.judge_all().await, (0, 0), "the largest group changed");
    // The last node of a cause leaving is a change of cause.
    let gone = w
        .placer
        .cache
        .lock()
        .nodes
        .apply(Update::Delete("w4".into()));
    drop(gone);
    assert_eq!(w.judge_all().await, (HELD, HELD), "a cause gone");
}
