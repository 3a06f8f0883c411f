//! Sysctl admission in the controller-manager: the webhook that judges pods and bindings on
//! every replica, the certificate it serves with, and the leader's placement of gated pods.
//!
//! - `facts.rs`, `cache.rs`: what the wing keeps of Nodes, SysctlPolicies and pods not yet
//!   bound, watched once per process and read by the webhook and the placement alike.
//! - `webhook/`: the mutating gate (`/mutate/pod`) and the validating review of bindings and of
//!   pods created on a node (`webhook::run`, every replica).
//! - `tls/`: the webhook's serving certificate: loaded from its Secret on every change, and
//!   issued, rotated and trusted through the caBundles when the controller-manager writes it.
//! - `placement/`: the placement of the pods the gate holds onto the nodes that admit them
//!   (`placement::run`, the leader).
//!
//! The rooms import one way: the placement judges as the webhook does, the webhook serves
//! with the certificate, both read the one cache.

pub mod cache;
pub mod facts;
pub mod placement;
pub mod tls;
pub mod webhook;
