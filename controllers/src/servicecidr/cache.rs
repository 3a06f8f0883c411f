//! The controller's view of the cluster, fed by the two watches, and upstream's event-handler
//! rules for which ServiceCIDR keys each change enqueues.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::ResourceExt;

use super::{
    decide::{CONDITION_READY, CidrState, FINALIZER, ReadyCondition},
    index::{CidrSet, IpEntry, IpIndex, Owner},
    prefix::{Addr, Family, Prefix},
};

pub const LABEL_FAMILY: &str = "ipaddress.kubernetes.io/ip-family";
pub const LABEL_MANAGED_BY: &str = "ipaddress.kubernetes.io/managed-by";
pub const MANAGED_BY_ALLOCATOR: &str = "ipallocator.k8s.io";

#[derive(Default)]
pub struct Cache {
    objects: BTreeMap<String, Arc<ServiceCIDR>>,
    pub cidrs: CidrSet,
    pub ips: IpIndex,
    /// Names seen since the current relist of each watch began.
    relist_cidrs: Option<HashSet<String>>,
    relist_ips: Option<HashSet<String>>,
}

pub fn spec_cidrs(obj: &ServiceCIDR) -> Vec<String> {
    obj.spec
        .as_ref()
        .and_then(|s| s.cidrs.clone())
        .unwrap_or_default()
}

/// The ServiceCIDR as the pure decision sees it.
pub fn cidr_state(obj: &ServiceCIDR) -> CidrState {
    let ready = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_READY))
        .map(|c| ReadyCondition {
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        });
    CidrState {
        name: obj.name_any(),
        has_finalizer: obj.finalizers().iter().any(|f| f == FINALIZER),
        deletion_timestamp: obj.metadata.deletion_timestamp.as_ref().map(|t| t.0),
        ready,
    }
}

/// The index entry for an IPAddress, or `None` when the allocator does not manage it.
pub fn ip_entry(obj: &IPAddress) -> Option<IpEntry> {
    let labels = obj.labels();
    if labels.get(LABEL_MANAGED_BY).map(String::as_str) != Some(MANAGED_BY_ALLOCATOR) {
        return None;
    }
    let owner = obj.spec.as_ref().map(|s| Owner {
        resource: s.parent_ref.resource.clone(),
        namespace: s.parent_ref.namespace.clone(),
        name: s.parent_ref.name.clone(),
    });
    Some(IpEntry {
        name: obj.name_any(),
        family_label: labels.get(LABEL_FAMILY).and_then(|f| Family::from_label(f)),
        owner,
    })
}

impl Cache {
    pub fn cidr(&self, name: &str) -> Option<Arc<ServiceCIDR>> {
        self.objects.get(name).cloned()
    }

    pub fn cidr_names(&self) -> impl Iterator<Item = &str> {
        self.objects.keys().map(String::as_str)
    }

    /// ServiceCIDR added or updated. An add enqueues the ServiceCIDR and every one overlapping
    /// it (itself included, as the lister already holds it); an update only itself.
    pub fn cidr_applied(&mut self, obj: ServiceCIDR) -> Vec<String> {
        let name = obj.name_any();
        if let Some(seen) = self.relist_cidrs.as_mut() {
            seen.insert(name.clone());
        }
        let cidrs = spec_cidrs(&obj);
        let added = self.objects.insert(name.clone(), Arc::new(obj)).is_none();
        self.cidrs.insert(&name, &cidrs);
        if !added {
            return vec![name];
        }
        let prefixes: Vec<Prefix> = cidrs.iter().filter_map(|c| c.parse().ok()).collect();
        let mut keys = vec![name.clone()];
        keys.extend(
            self.cidrs
                .overlapping(&prefixes)
                .into_iter()
                .filter(|n| *n != name),
        );
        keys
    }

    pub fn cidr_deleted(&mut self, name: &str) -> Vec<String> {
        self.objects.remove(name);
        self.cidrs.remove(name);
        vec![name.to_string()]
    }

    /// IPAddress added or updated. Upstream enqueues the containing ServiceCIDRs on add only;
    /// an update that makes an IP managed or unmanaged enqueues them too, since it changes what
    /// blocks a deletion.
    pub fn ip_applied(&mut self, obj: &IPAddress) -> Vec<String> {
        let name = obj.name_any();
        if let Some(seen) = self.relist_ips.as_mut() {
            seen.insert(name.clone());
        }
        match ip_entry(obj) {
            Some(entry) => match self.ips.upsert(entry) {
                Some(addr) => self.cidrs.containing(addr),
                None => {
                    if Addr::parse(&name).is_none() {
                        tracing::warn!(ipaddress = %name, "[SHOULD NOT HAPPEN] IPAddress name is not an IP; ignored");
                    }
                    vec![]
                }
            },
            None => self.ip_deleted(&name),
        }
    }

    pub fn ip_deleted(&mut self, name: &str) -> Vec<String> {
        match self.ips.remove(name) {
            Some(addr) => self.cidrs.containing(addr),
            None => vec![],
        }
    }

    pub fn begin_cidr_relist(&mut self) {
        self.relist_cidrs = Some(HashSet::new());
    }

    /// Ends a relist: what was not listed again was deleted while the watch was down.
    pub fn finish_cidr_relist(&mut self) -> Vec<String> {
        let Some(seen) = self.relist_cidrs.take() else {
            return vec![];
        };
        let gone: Vec<String> = self
            .objects
            .keys()
            .filter(|n| !seen.contains(*n))
            .cloned()
            .collect();
        gone.iter().flat_map(|n| self.cidr_deleted(n)).collect()
    }

    pub fn begin_ip_relist(&mut self) {
        self.relist_ips = Some(HashSet::new());
    }

    pub fn finish_ip_relist(&mut self) -> Vec<String> {
        let Some(seen) = self.relist_ips.take() else {
            return vec![];
        };
        let gone: Vec<String> = self
            .ips
            .names()
            .filter(|n| !seen.contains(*n))
            .map(String::from)
            .collect();
        gone.iter().flat_map(|n| self.ip_deleted(n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::{IPAddressSpec, ParentReference, ServiceCIDRSpec};
    use kube::api::ObjectMeta;

    fn cidr(name: &str, cidrs: &[&str]) -> ServiceCIDR {
        ServiceCIDR {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceCIDRSpec {
                cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            }),
            status: None,
        }
    }

    fn ip(name: &str, labels: &[(&str, &str)]) -> IPAddress {
        IPAddress {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(IPAddressSpec {
                parent_ref: ParentReference {
                    group: Some(String::new()),
                    resource: "services".into(),
                    namespace: Some("default".into()),
                    name: "web".into(),
                },
            }),
        }
    }

    fn managed(name: &str) -> IPAddress {
        let family = if name.contains(':') { "IPv6" } else { "IPv4" };
        ip(
            name,
            &[
                (LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR),
                (LABEL_FAMILY, family),
            ],
        )
    }

    #[test]
    fn cidr_add_enqueues_itself_and_overlapping_update_only_itself() {
        let mut c = Cache::default();
        assert_eq!(c.cidr_applied(cidr("a", &["10.0.0.0/16"])), vec!["a"]);
        assert_eq!(c.cidr_applied(cidr("b", &["10.1.0.0/16"])), vec!["b"]);
        assert_eq!(
            c.cidr_applied(cidr("c", &["10.0.5.0/24", "fd00::/64", "bad"])),
            vec!["c", "a"]
        );
        assert_eq!(
            c.cidr_applied(cidr("d", &["0.0.0.0/0"])),
            vec!["d", "a", "b", "c"]
        );
        assert_eq!(c.cidr_applied(cidr("a", &["10.0.0.0/8"])), vec!["a"]);
        assert_eq!(c.cidr_deleted("a"), vec!["a"]);
        assert!(c.cidr("a").is_none());
        assert!(c.cidrs.get("a").is_none());
    }

    #[test]
    fn ip_events_enqueue_containing_cidrs_of_managed_ips_only() {
        let mut c = Cache::default();
        c.cidr_applied(cidr("a", &["10.0.0.0/16"]));
        c.cidr_applied(cidr("b", &["10.0.1.0/24", "fd00::/112"]));
        assert_eq!(c.ip_applied(&managed("10.0.1.5")), vec!["a", "b"]);
        assert_eq!(
            c.ip_applied(&managed("10.0.1.5")),
            Vec::<String>::new(),
            "update"
        );
        assert_eq!(
            c.ip_applied(&managed("10.0.1.0")),
            vec!["a"],
            "network of b"
        );
        assert_eq!(c.ip_applied(&managed("fd00::ffff")), vec!["b"]);
        assert_eq!(c.ip_applied(&managed("fd00::")), Vec::<String>::new());
        assert_eq!(c.ip_applied(&managed("not-an-ip")), Vec::<String>::new());
        assert_eq!(c.ip_applied(&ip("10.0.2.7", &[])), Vec::<String>::new());
        assert_eq!(
            c.ip_applied(&ip("10.0.2.8", &[(LABEL_MANAGED_BY, "someone-else")])),
            Vec::<String>::new()
        );
        assert_eq!(c.ips.len(), 4);
        assert_eq!(c.ip_deleted("10.0.1.5"), vec!["a", "b"]);
        assert_eq!(c.ip_deleted("10.0.2.7"), Vec::<String>::new());
        // A managed IP relabelled as unmanaged leaves the index and re-syncs its owners.
        assert_eq!(c.ip_applied(&ip("fd00::ffff", &[])), vec!["b"]);
        assert_eq!(c.ips.len(), 2);
    }

    #[test]
    fn relist_turns_missing_objects_into_deletes() {
        let mut c = Cache::default();
        c.cidr_applied(cidr("a", &["10.0.0.0/16"]));
        c.cidr_applied(cidr("b", &["10.1.0.0/16"]));
        c.ip_applied(&managed("10.0.0.5"));
        c.ip_applied(&managed("10.1.0.5"));
        c.begin_cidr_relist();
        c.cidr_applied(cidr("a", &["10.0.0.0/16"]));
        assert_eq!(c.finish_cidr_relist(), vec!["b"]);
        assert!(c.cidr("b").is_none());
        c.begin_ip_relist();
        c.ip_applied(&managed("10.1.0.5"));
        assert_eq!(c.finish_ip_relist(), vec!["a"]);
        assert_eq!(c.ips.len(), 1);
        assert_eq!(c.finish_ip_relist(), Vec::<String>::new());
    }

    #[test]
    fn state_reads_finalizer_deletion_and_ready() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let mut o = cidr("a", &["10.0.0.0/16"]);
        assert_eq!(
            cidr_state(&o),
            CidrState {
                name: "a".into(),
                has_finalizer: false,
                deletion_timestamp: None,
                ready: None
            }
        );
        let t: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        o.metadata.finalizers = Some(vec!["other".into(), FINALIZER.into()]);
        o.metadata.deletion_timestamp = Some(Time(t));
        o.status = Some(k8s_openapi::api::networking::v1::ServiceCIDRStatus {
            conditions: Some(vec![
                Condition {
                    type_: "Other".into(),
                    status: "True".into(),
                    reason: "X".into(),
                    message: "x".into(),
                    last_transition_time: Time(t),
                    observed_generation: None,
                },
                Condition {
                    type_: CONDITION_READY.into(),
                    status: "True".into(),
                    reason: String::new(),
                    message: "Kubernetes Service CIDR is ready".into(),
                    last_transition_time: Time(t),
                    observed_generation: None,
                },
            ]),
        });
        let s = cidr_state(&o);
        assert!(s.has_finalizer);
        assert_eq!(s.deletion_timestamp, Some(t));
        assert_eq!(s.ready, Some(ReadyCondition::ready()));
    }
}
