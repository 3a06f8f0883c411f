//! What the controller watches (ServiceCIDRs, managed IPAddresses), folded into one cache.
//!
//! Each kind lives in a `plumbing::watch::cache::Store`, with the indexes the decision reads kept
//! beside it, and upstream's event-handler rules say which ServiceCIDR keys a change enqueues.

use std::{collections::BTreeSet, sync::Arc};

use futures::Stream;
use groundskeeper_plumbing::{
    Readiness, ReadyFlag,
    logging::klog::KObj,
    watch::cache::{Applied, Projected, Shared, Store, Update, Watches},
};
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::{
    Client, ResourceExt,
    runtime::watcher::{self, Event},
};

use super::{
    decide::{CONDITION_READY, CidrState, FINALIZER, ReadyCondition},
    index::{CidrSet, IpAddressFacts, IpIndex, Owner},
    prefix::{Addr, Family, Prefix},
};

pub const LABEL_FAMILY: &str = "ipaddress.kubernetes.io/ip-family";
pub const LABEL_MANAGED_BY: &str = "ipaddress.kubernetes.io/managed-by";
pub const MANAGED_BY_ALLOCATOR: &str = "ipallocator.k8s.io";
/// The readiness flags are `servicecidr/servicecidrs` and `servicecidr/ipaddresses`.
const COMPONENT: &str = "servicecidr";

#[derive(Default)]
pub struct CidrCache {
    objects: Store<String, Arc<ServiceCIDR>>,
    /// The parsed CIDRs of every object in `objects`.
    pub cidrs: CidrSet,
    pub ips: IpIndex,
}

/// Both watches folded into `cache`: their flags (ServiceCIDRs, IPAddresses) and the
/// ServiceCIDR keys each folded change enqueues.
pub fn watch(
    readiness: &Readiness,
    client: Client,
    cache: Shared<CidrCache>,
) -> (
    [ReadyFlag; 2],
    impl Stream<Item = Vec<String>> + Send + 'static,
) {
    let watches = Watches::new(readiness, COMPONENT, &client, &cache);
    let (cidr_flag, cidrs) = watches.follow(watcher::Config::default(), CidrCache::cidr_event);

    // Upstream's handlers ignore every other IPAddress, so they are not even fetched; one that
    // loses the label leaves the selection and arrives as a delete.
    let ip_config =
        watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY_ALLOCATOR}"));
    let (ip_flag, ips) = watches.follow(ip_config, CidrCache::ip_event);
    ([cidr_flag, ip_flag], futures::stream::select(cidrs, ips))
}

pub fn spec_cidrs(obj: &ServiceCIDR) -> Vec<String> {
    obj.spec
        .as_ref()
        .and_then(|s| s.cidrs.clone())
        .unwrap_or_default()
}

/// Indexes a ServiceCIDR's CIDRs, and whether it is being deleted.
pub fn index_cidr(cidrs: &mut CidrSet, name: &str, obj: &ServiceCIDR) {
    let deleting = obj.metadata.deletion_timestamp.is_some();
    cidrs.insert_with(name, &spec_cidrs(obj), deleting);
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

/// The facts of an IPAddress the index keeps, or `None` when the allocator does not manage it.
pub fn ip_address_facts(obj: &IPAddress) -> Option<IpAddressFacts> {
    let labels = obj.labels();
    if labels.get(LABEL_MANAGED_BY).map(String::as_str) != Some(MANAGED_BY_ALLOCATOR) {
        return None;
    }
    let owner = obj.spec.as_ref().map(|s| Owner {
        resource: s.parent_ref.resource.clone(),
        namespace: s.parent_ref.namespace.clone(),
        name: s.parent_ref.name.clone(),
    });
    Some(IpAddressFacts {
        name: obj.name_any().into(),
        family_label: labels.get(LABEL_FAMILY).and_then(|f| Family::from_label(f)),
        owner,
    })
}

/// What the index keeps of an IPAddress: managed ones whose name is an IP.
fn project_ip(obj: IPAddress) -> Projected<Arc<str>, IpAddressFacts> {
    let Some(name) = obj.metadata.name.as_deref() else {
        return Projected::Unusable;
    };
    match ip_address_facts(&obj) {
        Some(e) if Addr::parse(name).is_some() => Projected::Yes(e.name.clone(), e),
        Some(e) => {
            tracing::warn!(
                ipaddress = KObj::cluster(name).field(),
                "[SHOULD NOT HAPPEN] IPAddress name is not an IP; ignored"
            );
            Projected::No(e.name)
        }
        None => Projected::No(name.into()),
    }
}

fn project_cidr(obj: ServiceCIDR) -> Projected<String, Arc<ServiceCIDR>> {
    match obj.metadata.name.clone() {
        Some(name) => Projected::Yes(name, Arc::new(obj)),
        None => Projected::Unusable,
    }
}

impl CidrCache {
    pub fn cidr(&self, name: &str) -> Option<Arc<ServiceCIDR>> {
        self.objects.get(&name.to_string()).cloned()
    }

    /// Folds a ServiceCIDR event in. An add enqueues the ServiceCIDR and every one overlapping
    /// it (itself included, as the lister already holds it); an update only itself unless its
    /// CIDRs changed (`CidrCache::updated`); a delete only itself. A relist is each listed
    /// object's add or update and each vanished one's delete.
    pub fn cidr_event(&mut self, ev: Event<ServiceCIDR>) -> Vec<String> {
        match self.objects.apply_event(ev, project_cidr) {
            Applied::Nothing => vec![],
            Applied::Upserted { key, old } => {
                let before = self.cidrs.get(&key).map(<[Prefix]>::to_vec);
                if let Some(o) = self.objects.get(&key) {
                    index_cidr(&mut self.cidrs, &key, o);
                }
                match (old, before) {
                    (Some(_), Some(before)) => self.updated(key, &before),
                    _ => self.added(key),
                }
            }
            Applied::Removed { key, .. } => {
                self.cidrs.remove(&key);
                vec![key]
            }
            Applied::Relisted { old } => {
                let gone: Vec<String> = old
                    .keys()
                    .filter(|k| !self.objects.contains(k))
                    .cloned()
                    .collect();
                for k in &gone {
                    self.cidrs.remove(k);
                }
                for (k, o) in self.objects.iter() {
                    index_cidr(&mut self.cidrs, k, o);
                }
                let mut keys: BTreeSet<String> = gone.into_iter().collect();
                for k in self.objects.keys() {
                    match old.get(k) {
                        Some(was) => {
                            let before: Vec<Prefix> = spec_cidrs(was)
                                .iter()
                                .filter_map(|c| c.parse().ok())
                                .collect();
                            keys.extend(self.updated(k.clone(), &before));
                        }
                        None => keys.extend(self.added(k.clone())),
                    }
                }
                keys.into_iter().collect()
            }
        }
    }

    /// The keys an added ServiceCIDR enqueues: itself first, then those overlapping it.
    fn added(&self, name: String) -> Vec<String> {
        let prefixes: Vec<Prefix> = self.cidrs.get(&name).unwrap_or_default().to_vec();
        self.with_overlapping(name, &prefixes)
    }

    /// The keys an updated ServiceCIDR enqueues: itself, and when its CIDRs changed (a
    /// single-stack one made dual-stack: `spec.cidrs` is mutable so far) those overlapping
    /// them before or after. Upstream enqueues only itself on update, so a ServiceCIDR whose
    /// deletion waits for the IPs only it holds would not see a widened one come to cover them
    /// until something else touched it.
    fn updated(&self, name: String, before: &[Prefix]) -> Vec<String> {
        let after = self.cidrs.get(&name).unwrap_or_default();
        if after == before {
            return vec![name];
        }
        let mut both = before.to_vec();
        both.extend_from_slice(after);
        self.with_overlapping(name, &both)
    }

    fn with_overlapping(&self, name: String, prefixes: &[Prefix]) -> Vec<String> {
        let overlapping = self.cidrs.overlapping(prefixes);
        let others = overlapping.into_iter().filter(|n| *n != name);
        std::iter::once(name.clone()).chain(others).collect()
    }

    /// Folds an IPAddress event in. Upstream enqueues the containing ServiceCIDRs on add and
    /// delete only; an update that makes an IP managed or unmanaged enqueues them too, since
    /// it changes what blocks a deletion. A relist is the adds and deletes it amounts to.
    pub fn ip_event(&mut self, ev: Event<IPAddress>) -> Vec<String> {
        let Some(u) = Update::from_event(ev, project_ip) else {
            return vec![];
        };
        let relist = matches!(u, Update::InitDone);
        let keys = self
            .ips
            .apply(u)
            .into_iter()
            .flat_map(|a| self.cidrs.containing(a));
        if relist {
            keys.collect::<BTreeSet<_>>().into_iter().collect()
        } else {
            keys.collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::networking::{allocated_ip, ip_address, service_cidr as cidr};

    fn ip(name: &str, labels: &[(&str, &str)]) -> IPAddress {
        ip_address(name, labels, "default", "web")
    }

    fn managed(name: &str) -> IPAddress {
        allocated_ip(name, "default", "web")
    }

    fn apply_cidr(c: &mut CidrCache, o: ServiceCIDR) -> Vec<String> {
        c.cidr_event(Event::Apply(o))
    }

    fn delete_cidr(c: &mut CidrCache, name: &str) -> Vec<String> {
        c.cidr_event(Event::Delete(cidr(name, [""; 0])))
    }

    fn apply_ip(c: &mut CidrCache, o: IPAddress) -> Vec<String> {
        c.ip_event(Event::Apply(o))
    }

    fn delete_ip(c: &mut CidrCache, name: &str) -> Vec<String> {
        c.ip_event(Event::Delete(managed(name)))
    }

    /// A full relist of `objects`, as the watcher delivers it; what it enqueues.
    fn relist<W>(
        fold: fn(&mut CidrCache, Event<W>) -> Vec<String>,
        c: &mut CidrCache,
        objects: Vec<W>,
    ) -> Vec<String> {
        let mut keys = fold(c, Event::Init);
        for o in objects {
            keys.extend(fold(c, Event::InitApply(o)));
        }
        keys.extend(fold(c, Event::InitDone));
        keys
    }

    #[test]
    fn cidr_add_enqueues_itself_and_overlapping_update_only_itself() {
        let mut c = CidrCache::default();
        assert_eq!(apply_cidr(&mut c, cidr("a", ["10.0.0.0/16"])), vec!["a"]);
        assert_eq!(apply_cidr(&mut c, cidr("b", ["10.1.0.0/16"])), vec!["b"]);
        assert_eq!(
            apply_cidr(&mut c, cidr("c", ["10.0.5.0/24", "fd00::/64", "bad"])),
            vec!["c", "a"]
        );
        assert_eq!(
            apply_cidr(&mut c, cidr("d", ["0.0.0.0/0"])),
            vec!["d", "a", "b", "c"]
        );
        assert_eq!(apply_cidr(&mut c, cidr("a", ["10.0.0.0/16"])), vec!["a"]);
        // Beyond upstream: new CIDRs re-check their overlapping neighbours.
        assert_eq!(
            apply_cidr(&mut c, cidr("a", ["10.0.0.0/8"])),
            vec!["a", "b", "c", "d"]
        );
        assert_eq!(delete_cidr(&mut c, "a"), vec!["a"]);
        assert!(c.cidr("a").is_none());
        assert!(c.cidrs.get("a").is_none());
    }

    #[test]
    fn an_update_that_changes_the_cidrs_enqueues_the_overlapping_ones() {
        let mut c = CidrCache::default();
        apply_cidr(&mut c, cidr("blocked", ["10.0.0.0/24", "fd00::/112"]));
        apply_cidr(&mut c, cidr("wide", ["10.1.0.0/16"]));
        apply_cidr(&mut c, cidr("other", ["10.9.0.0/16"]));
        // Made dual-stack: its new IPv6 CIDR covers blocked's, which may now be deleted.
        assert_eq!(
            apply_cidr(&mut c, cidr("wide", ["10.1.0.0/16", "fd00::/64"])),
            vec!["wide", "blocked"]
        );
        assert_eq!(
            apply_cidr(&mut c, cidr("wide", ["10.1.0.0/16", "fd00::/64"])),
            vec!["wide"],
            "the same CIDRs: itself only"
        );
        // What it overlapped before counts too (a CIDR given up re-checks its old neighbours).
        assert_eq!(
            apply_cidr(&mut c, cidr("wide", ["10.9.0.0/24"])),
            vec!["wide", "blocked", "other"]
        );
        // A relist that finds the CIDRs changed does the same.
        let listed = vec![
            cidr("blocked", ["10.0.0.0/24", "fd00::/112"]),
            cidr("wide", ["10.9.0.0/24", "fd00::/64"]),
            cidr("other", ["10.9.0.0/16"]),
        ];
        assert_eq!(
            relist(CidrCache::cidr_event, &mut c, listed),
            vec!["blocked", "other", "wide"]
        );
    }

    #[test]
    fn ip_events_enqueue_containing_cidrs_of_managed_ips_only() {
        let mut c = CidrCache::default();
        apply_cidr(&mut c, cidr("a", ["10.0.0.0/16"]));
        apply_cidr(&mut c, cidr("b", ["10.0.1.0/24", "fd00::/112"]));
        assert_eq!(apply_ip(&mut c, managed("10.0.1.5")), vec!["a", "b"]);
        assert_eq!(
            apply_ip(&mut c, managed("10.0.1.5")),
            Vec::<String>::new(),
            "update"
        );
        assert_eq!(
            apply_ip(&mut c, managed("10.0.1.0")),
            vec!["a"],
            "network of b"
        );
        assert_eq!(apply_ip(&mut c, managed("fd00::ffff")), vec!["b"]);
        assert_eq!(apply_ip(&mut c, managed("fd00::")), Vec::<String>::new());
        assert_eq!(apply_ip(&mut c, managed("not-an-ip")), Vec::<String>::new());
        assert_eq!(apply_ip(&mut c, ip("10.0.2.7", &[])), Vec::<String>::new());
        assert_eq!(
            apply_ip(
                &mut c,
                ip("10.0.2.8", &[(LABEL_MANAGED_BY, "someone-else")])
            ),
            Vec::<String>::new()
        );
        assert_eq!(c.ips.len(), 4);
        assert_eq!(delete_ip(&mut c, "10.0.1.5"), vec!["a", "b"]);
        assert_eq!(delete_ip(&mut c, "10.0.2.7"), Vec::<String>::new());
        // A managed IP relabelled as unmanaged leaves the index and re-syncs its owners.
        assert_eq!(apply_ip(&mut c, ip("fd00::ffff", &[])), vec!["b"]);
        assert_eq!(c.ips.len(), 2);
    }

    #[test]
    fn relist_turns_missing_objects_into_deletes() {
        let mut c = CidrCache::default();
        apply_cidr(&mut c, cidr("a", ["10.0.0.0/16"]));
        apply_cidr(&mut c, cidr("b", ["10.1.0.0/16"]));
        apply_ip(&mut c, managed("10.0.0.5"));
        apply_ip(&mut c, managed("10.1.0.5"));
        // a is listed again (an update), b is gone (a delete).
        assert_eq!(
            relist(
                CidrCache::cidr_event,
                &mut c,
                vec![cidr("a", ["10.0.0.0/16"])]
            ),
            vec!["a", "b"]
        );
        assert!(c.cidr("b").is_none());
        assert_eq!(
            relist(CidrCache::ip_event, &mut c, vec![managed("10.1.0.5")]),
            vec!["a"]
        );
        assert_eq!(c.ips.len(), 1);
        assert_eq!(
            relist(CidrCache::ip_event, &mut c, vec![managed("10.1.0.5")]),
            Vec::<String>::new(),
            "nothing changed"
        );
    }

    #[test]
    fn relist_adds_enqueue_as_adds_and_show_only_once_listed() {
        let mut c = CidrCache::default();
        apply_cidr(&mut c, cidr("a", ["10.0.0.0/16"]));
        c.cidr_event(Event::Init);
        c.cidr_event(Event::InitApply(cidr("a", ["10.0.0.0/16"])));
        c.cidr_event(Event::InitApply(cidr("c", ["10.0.5.0/24"])));
        assert!(c.cidr("c").is_none(), "not before the list completes");
        assert_eq!(c.cidr_event(Event::InitDone), vec!["a", "c"]);
        assert!(c.cidrs.get("c").is_some());
        c.ip_event(Event::Init);
        c.ip_event(Event::InitApply(managed("10.0.5.9")));
        assert!(c.ips.is_empty(), "not before the list completes");
        assert_eq!(c.ip_event(Event::InitDone), vec!["a", "c"]);
        assert_eq!(c.ips.len(), 1);
    }

    #[test]
    fn state_reads_finalizer_deletion_and_ready() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let mut o = cidr("a", ["10.0.0.0/16"]);
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
