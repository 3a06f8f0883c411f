//! Who holds a leader-election Lease, and whether a replica says it leads: what the leader and
//! fencing tests poll on both sides of a takeover.

use std::net::SocketAddr;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::Cluster;

/// The gauge a replica exports once leader election runs: 1 while it leads, 0 otherwise.
pub const LEADER_GAUGE: &str = "groundskeeper_leader_election_is_leader";

/// The flags that put a replica in the election for `ns/lease` as `identity`: every replica
/// of a leader or fencing test starts with them.
pub fn election_args<'a>(lease: &'a str, ns: &'a str, identity: &'a str) -> [&'a str; 6] {
    [
        "--leader-elect-lease-name",
        lease,
        "--leader-elect-namespace",
        ns,
        "--leader-elect-identity",
        identity,
    ]
}

/// The Lease's holder identity; empty when the Lease or its holder is not there yet.
pub async fn holder(c: &Cluster, ns: &str, lease: &str) -> anyhow::Result<String> {
    let api: Api<Lease> = Api::namespaced(c.client.clone(), ns);
    Ok(api
        .get_opt(lease)
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .unwrap_or_default())
}

/// Whether the replica serving `admin` reports leading; false when it does not answer.
pub async fn leads(admin: SocketAddr) -> bool {
    matches!(crate::metric(admin, LEADER_GAUGE).await, Ok(Some(v)) if v == 1.0)
}
