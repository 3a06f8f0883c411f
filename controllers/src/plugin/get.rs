//! `get servicecidrs`: what Kubernetes' own printer leaves out of a ServiceCIDR (only NAME,
//! CIDRS and AGE there): its `Ready` condition, the deletion finalizer, and, while it is being
//! deleted, the IPAddresses that keep it, decided by the controller's own code.

use jiff::Timestamp;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::{Api, Client, ResourceExt, api::ListParams};
use serde::Serialize;

use super::output::{Answer, age, table};
use crate::servicecidr::{
    blockers::{Blocking, blocking},
    cache::{
        LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR, cidr_state, index_cidr, ip_address_facts,
        spec_cidrs,
    },
    index::{CidrSet, IpIndex},
};

/// Blockers named in the table's BLOCKED BY column; the structured output names more.
const NAMED_IN_TABLE: usize = 3;
const NAMED_STRUCTURED: usize = 10;

/// One ServiceCIDR's row.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub name: String,
    pub cidrs: Vec<String>,
    /// The `Ready` condition, when it has one.
    pub ready: Option<Ready>,
    /// `networking.k8s.io/service-cidr-finalizer` is present.
    pub finalizer: bool,
    pub deleting: bool,
    /// Only while it is being deleted: what keeps it.
    pub blocked_by: Option<BlockedBy>,
    pub creation_timestamp: Option<Timestamp>,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Ready {
    pub status: String,
    pub reason: String,
    pub message: String,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BlockedBy {
    /// IPAddresses that lie inside it and in no other ServiceCIDR.
    pub count: usize,
    /// Another ServiceCIDR covers all of its CIDRs: nothing can block it.
    pub covered_by_another: bool,
    /// The first few, by address.
    pub first: Vec<Blocker>,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Blocker {
    pub ip: String,
    pub owner: Option<String>,
}

/// The rows of `cidrs` (every one, or those named), decided on `ips` as the controller does.
pub fn rows(all: &[ServiceCIDR], ips: &[IPAddress], names: &[String]) -> anyhow::Result<Vec<Row>> {
    let mut set = CidrSet::default();
    for c in all {
        index_cidr(&mut set, &c.name_any(), c);
    }
    let mut index = IpIndex::default();
    for e in ips.iter().filter_map(ip_address_facts) {
        index.upsert(e);
    }
    let wanted: Vec<&ServiceCIDR> = match names {
        [] => all.iter().collect(),
        names => {
            let mut out = Vec::new();
            for n in names {
                match all.iter().find(|c| c.name_any() == *n) {
                    Some(c) => out.push(c),
                    None => anyhow::bail!("servicecidrs.networking.k8s.io {n:?} not found"),
                }
            }
            out
        }
    };
    Ok(wanted
        .into_iter()
        .map(|c| {
            let name = c.name_any();
            let state = cidr_state(c);
            let deleting = state.deletion_timestamp.is_some();
            let blocked_by = deleting.then(|| match blocking(&set, &index, &name) {
                Blocking::Covered => BlockedBy {
                    count: 0,
                    covered_by_another: true,
                    first: Vec::new(),
                },
                Blocking::Clear => BlockedBy {
                    count: 0,
                    covered_by_another: false,
                    first: Vec::new(),
                },
                Blocking::Blocked(found) => BlockedBy {
                    count: found.len(),
                    covered_by_another: false,
                    first: found
                        .iter()
                        .take(NAMED_STRUCTURED)
                        .map(|b| Blocker {
                            ip: b.entry.name.to_string(),
                            owner: b.entry.owner.as_ref().map(ToString::to_string),
                        })
                        .collect(),
                },
            });
            Row {
                cidrs: spec_cidrs(c),
                ready: state.ready.map(|r| Ready {
                    status: r.status,
                    reason: r.reason,
                    message: r.message,
                }),
                finalizer: state.has_finalizer,
                deleting,
                blocked_by,
                creation_timestamp: c.metadata.creation_timestamp.as_ref().map(|t| t.0),
                name,
            }
        })
        .collect())
}

/// Lists every ServiceCIDR and allocator-managed IPAddress once.
pub async fn servicecidrs(client: &Client, names: &[String]) -> anyhow::Result<Vec<Row>> {
    let all = Api::<ServiceCIDR>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let selector = format!("{LABEL_MANAGED_BY}={MANAGED_BY_ALLOCATOR}");
    let ips = Api::<IPAddress>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await?;
    rows(&all.items, &ips.items, names)
}

/// The table and the structured list of `rows`.
pub fn answer(rows: &[Row], now: Timestamp) -> anyhow::Result<Answer> {
    let none = || "<none>".to_string();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let ready = match &r.ready {
                None => "<unknown>".into(),
                Some(c) if c.reason.is_empty() => c.status.clone(),
                Some(c) => format!("{} ({})", c.status, c.reason),
            };
            let blocked = match &r.blocked_by {
                None => none(),
                Some(b) if b.covered_by_another => "0 (covered by another)".into(),
                Some(b) if b.count == 0 => "0".into(),
                Some(b) => {
                    let ips: Vec<&str> = b
                        .first
                        .iter()
                        .take(NAMED_IN_TABLE)
                        .map(|b| b.ip.as_str())
                        .collect();
                    let more = if b.count > ips.len() { ",..." } else { "" };
                    format!("{}: {}{more}", b.count, ips.join(","))
                }
            };
            vec![
                r.name.clone(),
                r.cidrs.join(","),
                ready,
                if r.finalizer { "yes" } else { "no" }.into(),
                blocked,
                r.creation_timestamp
                    .map(|t| age(now.duration_since(t)))
                    .unwrap_or_else(|| "<unknown>".into()),
            ]
        })
        .collect();
    let text = match cells.is_empty() {
        true => "No resources found\n".into(),
        false => table(
            &["NAME", "CIDRS", "READY", "FINALIZER", "BLOCKED BY", "AGE"],
            &cells,
        ),
    };
    Answer::new(
        text,
        &serde_json::json!({ "kind": "ServiceCIDRList", "items": rows }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::output::Output;

    fn cidr(name: &str, cidr: &str, deleting: bool) -> ServiceCIDR {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": ["networking.k8s.io/service-cidr-finalizer"],
                "deletionTimestamp": deleting.then_some("2026-01-01T01:00:00Z"),
            },
            "spec": {"cidrs": [cidr]},
            "status": {"conditions": [{
                "type": "Ready", "status": if deleting { "False" } else { "True" },
                "reason": if deleting { "Terminating" } else { "" }, "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap()
    }

    fn ip(addr: &str) -> IPAddress {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": addr, "labels": {
                LABEL_MANAGED_BY: MANAGED_BY_ALLOCATOR,
                "ipaddress.kubernetes.io/ip-family": "IPv4"}},
            "spec": {"parentRef": {"group": "", "resource": "services", "namespace": "shop", "name": "web"}},
        }))
        .unwrap()
    }

    #[test]
    fn a_deleting_cidr_names_what_keeps_it() {
        let all = [
            cidr("kept", "10.1.0.0/24", true),
            cidr("plain", "10.2.0.0/24", false),
        ];
        let ips: Vec<IPAddress> = (1..=5).map(|i| ip(&format!("10.1.0.{i}"))).collect();
        let rows = rows(&all, &ips, &[]).unwrap();
        let now: Timestamp = "2026-01-01T02:00:00Z".parse().unwrap();
        let a = answer(&rows, now).unwrap();
        let text = a.text.clone();
        assert!(
            text.starts_with("NAME    CIDRS         READY                 FINALIZER   BLOCKED BY"),
            "{text}"
        );
        assert!(
            text.contains(
                "False (Terminating)   yes         5: 10.1.0.1,10.1.0.2,10.1.0.3,...   120m"
            ),
            "{text}"
        );
        assert!(
            text.contains("plain   10.2.0.0/24   True                  yes         <none>"),
            "{text}"
        );
        let y: serde_json::Value = serde_norway::from_str(&a.print(Output::Yaml).unwrap()).unwrap();
        assert_eq!(y["items"][0]["blockedBy"]["count"], 5);
        assert_eq!(
            y["items"][0]["blockedBy"]["first"][0]["owner"],
            "services shop/web"
        );
        assert_eq!(y["items"][0]["ready"]["reason"], "Terminating");
        assert_eq!(y["items"][1]["blockedBy"], serde_json::Value::Null);
        assert!(super::rows(&all, &ips, &["nope".into()]).is_err());
    }
}
