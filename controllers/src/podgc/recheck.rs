//! The out-of-service pass's last word before a force delete: a live GET of the pod's node.
//!
//! The pass decides on the Node cache, which can lag the apiserver (an admin who removed the
//! taint a moment ago). Before the first force delete on a node, the node is read from the
//! apiserver and judged by the pass's own rule (`decide::out_of_service_node`: not Ready and
//! tainted `node.kubernetes.io/out-of-service`); only a node that still is lets its pods go.
//! One GET per node per pass, shared by every pod on it: `Recheck`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use futures::future::BoxFuture;
use groundskeeper_plumbing::logging::klog::KObj;
use kube::{Api, Client};
use tokio::sync::OnceCell;

use super::{decide::out_of_service_node, facts::NodeFacts, wire::WireNode};

/// The node reads the applier makes; a trait so that tests give the node they need.
pub trait NodeReads: Send + Sync {
    /// The node as the apiserver has it now; `None` when it answers NotFound.
    fn node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<NodeFacts>, kube::Error>>;
}

/// The reads, made (on the process's client and its QPS budget).
pub struct KubeNodes(Api<WireNode>);

impl KubeNodes {
    pub fn new(client: Client) -> Self {
        Self(Api::all(client))
    }
}

impl NodeReads for KubeNodes {
    fn node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<NodeFacts>, kube::Error>> {
        Box::pin(async move {
            let node = self.0.get_opt(name).await?;
            Ok(node.as_ref().map(NodeFacts::from_wire))
        })
    }
}

/// What the live read says of a node the pass chose pods on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveNode {
    /// Still not Ready and tainted: its pods may go.
    OutOfService,
    /// NotFound.
    Gone,
    /// Ready again, or without the out-of-service taint.
    InService,
    /// The read failed (or there is no way to read): the cache alone decides nothing here.
    Unread,
}

impl LiveNode {
    /// The pass's rule, on the node as read.
    pub fn from_read(read: &Result<Option<NodeFacts>, kube::Error>) -> Self {
        match read {
            Err(_) => LiveNode::Unread,
            Ok(None) => LiveNode::Gone,
            Ok(Some(n)) if out_of_service_node(Some(n)) => LiveNode::OutOfService,
            Ok(Some(_)) => LiveNode::InService,
        }
    }

    /// The `live_node` label of `groundskeeper_podgc_out_of_service_kept_total`.
    pub fn label(self) -> &'static str {
        match self {
            LiveNode::OutOfService => "out_of_service",
            LiveNode::Gone => "gone",
            LiveNode::InService => "in_service",
            LiveNode::Unread => "unread",
        }
    }

    /// Why the pods are kept, in their log line.
    pub fn as_str(self) -> &'static str {
        match self {
            LiveNode::OutOfService => "its node is still out of service",
            LiveNode::Gone => "a live read of its node found it gone; left to be judged again",
            LiveNode::InService => {
                "a live read of its node found it Ready again or without the out-of-service taint"
            }
            LiveNode::Unread => {
                "its node could not be read live; not force-deleting on the cache alone"
            }
        }
    }
}

/// One pass's live reads: the first pod on a node reads it, the others (concurrent ones
/// included) wait for that read and share its answer.
#[derive(Default)]
pub struct Recheck {
    nodes: Mutex<HashMap<Arc<str>, Arc<OnceCell<LiveNode>>>>,
}

impl Recheck {
    /// How `node` stands now, read at most once in this pass. Without `reads`, unread.
    pub async fn node(&self, reads: Option<&dyn NodeReads>, node: &Arc<str>) -> LiveNode {
        let cell = self
            .nodes
            .lock()
            .expect("recheck lock")
            .entry(node.clone())
            .or_default()
            .clone();
        *cell
            .get_or_init(|| async {
                let Some(reads) = reads else {
                    return LiveNode::Unread;
                };
                let read = reads.node(node).await;
                let live = LiveNode::from_read(&read);
                match (&read, live) {
                    (Err(e), _) => tracing::warn!(node = KObj::cluster(node).field(), error = %e, "reading out-of-service node live failed; its pods are kept this cycle"),
                    (_, LiveNode::OutOfService) => {}
                    _ => tracing::info!(node = KObj::cluster(node).field(), live_node = live.label(), "out-of-service node no longer so on a live read; its pods are kept"),
                }
                live
            })
            .await
    }

    /// How many nodes this pass read (each at most once).
    pub fn reads(&self) -> usize {
        self.nodes.lock().expect("recheck lock").len()
    }
}

/// A node read answering every name alike (`None`: NotFound) and counting the reads, for the
/// tests of the applier and the cycle.
#[cfg(test)]
#[derive(Default)]
pub struct Always(pub Option<NodeFacts>, pub std::sync::atomic::AtomicUsize);

#[cfg(test)]
impl Always {
    /// Every node still not Ready and tainted.
    pub fn out_of_service() -> Arc<Self> {
        Arc::new(Always(
            Some(NodeFacts {
                ready: false,
                out_of_service: true,
            }),
            Default::default(),
        ))
    }

    pub fn reads(&self) -> usize {
        self.1.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(test)]
impl NodeReads for Always {
    fn node<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<NodeFacts>, kube::Error>> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move { Ok(self.0) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Answers each node read with what the name says, counting the reads.
    #[derive(Default)]
    struct Named(AtomicUsize);

    impl NodeReads for Named {
        fn node<'a>(
            &'a self,
            name: &'a str,
        ) -> BoxFuture<'a, Result<Option<NodeFacts>, kube::Error>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::task::yield_now().await;
                let facts = |ready, out_of_service| {
                    Ok(Some(NodeFacts {
                        ready,
                        out_of_service,
                    }))
                };
                match name {
                    "out" => facts(false, true),
                    "untainted" => facts(false, false),
                    "ready" => facts(true, true),
                    "gone" => Ok(None),
                    _ => Err(kube::Error::Api(
                        kube::core::Status::failure("down", "ServiceUnavailable")
                            .with_code(503)
                            .boxed(),
                    )),
                }
            })
        }
    }

    /// Only a node the apiserver still has not Ready and tainted lets its pods go; a node gone,
    /// back in service or unreadable keeps them.
    #[tokio::test]
    async fn only_a_node_still_out_of_service_lets_its_pods_go() {
        let reads = Named::default();
        for (node, want) in [
            ("out", LiveNode::OutOfService),
            ("untainted", LiveNode::InService),
            ("ready", LiveNode::InService),
            ("gone", LiveNode::Gone),
            ("broken", LiveNode::Unread),
        ] {
            let r = Recheck::default();
            assert_eq!(r.node(Some(&reads), &node.into()).await, want, "{node}");
            assert_eq!(
                Recheck::default().node(None, &node.into()).await,
                LiveNode::Unread,
                "{node}: no way to read is no permission"
            );
        }
    }

    /// However many pods of a pass are on a node, and however many ask at once, the node is
    /// read once.
    #[tokio::test]
    async fn one_read_per_node_per_pass() {
        let reads = Named::default();
        let r = Recheck::default();
        let nodes: Vec<Arc<str>> = ["out", "gone", "out", "broken", "out", "gone", "broken"]
            .into_iter()
            .cycle()
            .take(70)
            .map(Arc::from)
            .collect();
        let answers =
            futures::future::join_all(nodes.iter().map(|n| r.node(Some(&reads), n))).await;
        assert_eq!(
            reads.0.load(Ordering::SeqCst),
            3,
            "one GET per distinct node"
        );
        assert_eq!(r.reads(), 3);
        for (n, a) in nodes.iter().zip(answers) {
            assert_eq!(a, LiveNode::from_read(&reads_once(n).await), "{n}");
        }
        // A new pass reads again.
        Recheck::default().node(Some(&reads), &"out".into()).await;
        assert_eq!(reads.0.load(Ordering::SeqCst), 4);
    }

    async fn reads_once(n: &str) -> Result<Option<NodeFacts>, kube::Error> {
        Named::default().node(n).await
    }
}
