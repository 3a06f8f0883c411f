//! Reporting malformed policy annotations, once per distinct bad value.
//!
//! A log line and a Warning Event on the Namespace, not every cycle. The Event goes through
//! plumbing's Event writer; a second bad value in the same namespace is an Event of its own
//! (`Repeat::SeriesPerNote`), not a count in the first one's series.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use groundskeeper_plumbing::events::{Notice, Repeat, Severity};
use k8s_openapi::api::core::v1::ObjectReference;

use super::facts::NsAnnotations;
use super::policy::malformed;

pub const REASON: &str = "InvalidPodGCPolicy";
/// The reporting controller of PodGC's Events (`plumbing::events::REPORTING_DOMAIN`'s scheme).
pub const CONTROLLER: &str = "groundskeeper.dev/podgc";

/// The Warning Event for a malformed annotation on `namespace`.
pub fn invalid_policy(namespace: &str, note: String) -> Notice {
    Notice {
        severity: Severity::Warning,
        reason: REASON.into(),
        action: "ParsePolicy".into(),
        note,
        // A Namespace is cluster-scoped: its Events live in "default", as client-go's
        // recorder puts them (the apiserver refuses them anywhere else).
        regarding: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Namespace".into()),
            name: Some(namespace.into()),
            ..ObjectReference::default()
        },
        repeat: Repeat::SeriesPerNote,
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
