//! Builders for the networking.k8s.io objects (ServiceCIDR, IPAddress) the tests create.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPAddress, IPAddressSpec, ParentReference, ServiceCIDR, ServiceCIDRSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::ObjectMeta;

pub const LABEL_FAMILY: &str = "ipaddress.kubernetes.io/ip-family";
pub const LABEL_MANAGED_BY: &str = "ipaddress.kubernetes.io/managed-by";
pub const MANAGED_BY_ALLOCATOR: &str = "ipallocator.k8s.io";

/// A ServiceCIDR named `name` with `cidrs` in its spec, nothing else set.
pub fn service_cidr(name: &str, cidrs: impl IntoIterator<Item = impl Into<String>>) -> ServiceCIDR {
    ServiceCIDR {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ServiceCIDRSpec {
            cidrs: Some(cidrs.into_iter().map(Into::into).collect()),
        }),
        status: None,
    }
}

/// An IPAddress named `ip` with `labels`, allocated to Service `namespace/service`.
pub fn ip_address(ip: &str, labels: &[(&str, &str)], namespace: &str, service: &str) -> IPAddress {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    IPAddress {
        metadata: ObjectMeta {
            name: Some(ip.into()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(IPAddressSpec {
            parent_ref: ParentReference {
                group: Some(String::new()),
                resource: "services".into(),
                namespace: Some(namespace.into()),
                name: service.into(),
            },
        }),
    }
}

/// An IPAddress as the Service IP allocator makes it: managed by it, labelled with the family
/// its name reads as (`IPv6` when it has a colon).
pub fn allocated_ip(ip: &str, namespace: &str, service: &str) -> IPAddress {
    let family = if ip.contains(':') { "IPv6" } else { "IPv4" };
    ip_address(
        ip,
        &[
            (LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR),
            (LABEL_FAMILY, family),
        ],
        namespace,
        service,
    )
}

/// The `Ready` condition of a ServiceCIDR's status, if it has one.
pub fn ready_condition(o: &ServiceCIDR) -> Option<&Condition> {
    o.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}
