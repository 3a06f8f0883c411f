//! Reporting malformed policy annotations, once per distinct bad value.
//!
//! A log line and a Warning Event on the Namespace, not every cycle. The Event is written
//! through `apply::Writes` (`KubeWrites` uses [`KubeEvents`]), so the once-only bookkeeping is
//! tested without a cluster.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event as K8sEvent},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{Api, Client, api::PostParams};

use super::facts::NsAnnotations;
use super::policy::malformed;

pub const REASON: &str = "InvalidPodGCPolicy";

/// Creates each Event itself: kube's `Recorder` folds events with the same reason and object
/// into one series that keeps the first note, which would hide a second bad value.
pub struct KubeEvents {
    api: Api<K8sEvent>,
    instance: String,
}

impl KubeEvents {
    pub fn new(client: Client) -> Self {
        Self {
            // A Namespace is cluster-scoped: its Events live in "default", as client-go's
            // recorder puts them (the apiserver refuses them anywhere else).
            api: Api::namespaced(client, "default"),
            instance: std::env::var("POD_NAME")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| CONTROLLER.into()),
        }
    }
}

const CONTROLLER: &str = "groundskeeper.dev/podgc";

impl KubeEvents {
    pub fn warn(
        &self,
        namespace: &str,
        note: String,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send + '_ {
        let now = jiff::Timestamp::now();
        let ev = K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!("{namespace}.{:x}", now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some("Warning".into()),
            reason: Some(REASON.into()),
            action: Some("ParsePolicy".into()),
            note: Some(note),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Namespace".into()),
                name: Some(namespace.into()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        };
        async move {
            self.api
                .create(&PostParams::default(), &ev)
                .await
                .map(|_| ())
        }
    }
}

/// Which (namespace, annotation, value) were already reported.
#[derive(Default)]
pub struct Reported {
    seen: HashSet<(Arc<str>, &'static str, Box<str>)>,
}

impl Reported {
    /// The malformed values not reported yet, as (namespace, annotation, value). Values that
    /// are no longer there are forgotten, so putting a bad value back reports it again.
    pub fn fresh<'a>(
        &mut self,
        namespaces: &'a BTreeMap<Arc<str>, NsAnnotations>,
    ) -> Vec<(Arc<str>, &'static str, &'a str)> {
        let now: Vec<(Arc<str>, &'static str, &'a str)> = namespaces
            .iter()
            .flat_map(|(ns, a)| malformed(a).into_iter().map(|(k, v)| (ns.clone(), k, v)))
            .collect();
        self.seen.retain(|(ns, k, v)| {
            now.iter()
                .any(|(n, k2, v2)| n == ns && k2 == k && **v == **v2)
        });
        now.into_iter()
            .filter(|(ns, k, v)| self.seen.insert((ns.clone(), k, (*v).into())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podgc::policy::{THRESHOLD_ANNOTATION, TTL_ANNOTATION};

    fn ns(list: &[(&str, Option<&str>, Option<&str>)]) -> BTreeMap<Arc<str>, NsAnnotations> {
        list.iter()
            .map(|(n, ttl, th)| {
                (
                    Arc::from(*n),
                    NsAnnotations {
                        ttl: ttl.map(Into::into),
                        threshold: th.map(Into::into),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn each_bad_value_is_reported_once() {
        let mut r = Reported::default();
        type Step = (
            &'static str,
            BTreeMap<Arc<str>, NsAnnotations>,
            Vec<(&'static str, &'static str, &'static str)>,
        );
        let steps: [Step; 6] = [
            (
                "first sight",
                ns(&[("a", Some("1 week"), Some("3")), ("b", Some("1h"), None)]),
                vec![("a", TTL_ANNOTATION, "1 week")],
            ),
            (
                "next cycle: nothing new",
                ns(&[("a", Some("1 week"), Some("3")), ("b", Some("1h"), None)]),
                vec![],
            ),
            (
                "another bad value in the same namespace",
                ns(&[("a", Some("2 weeks"), Some("x"))]),
                vec![
                    ("a", TTL_ANNOTATION, "2 weeks"),
                    ("a", THRESHOLD_ANNOTATION, "x"),
                ],
            ),
            ("fixed", ns(&[("a", Some("2h"), Some("3"))]), vec![]),
            (
                "a value reported before, put back after a fix, is reported again",
                ns(&[("a", Some("2 weeks"), Some("3"))]),
                vec![("a", TTL_ANNOTATION, "2 weeks")],
            ),
            ("removed", ns(&[]), vec![]),
        ];
        for (what, namespaces, want) in steps {
            let got: Vec<_> = r
                .fresh(&namespaces)
                .into_iter()
                .map(|(n, k, v)| (n.to_string(), k, v.to_string()))
                .collect();
            let want: Vec<_> = want
                .into_iter()
                .map(|(n, k, v)| (n.to_string(), k, v.to_string()))
                .collect();
            assert_eq!(got, want, "{what}");
        }
    }
}
