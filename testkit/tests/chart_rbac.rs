//! The chart grants each component exactly the API access its code uses: the rules rendered by
//! `helm template` equal the lists kept next to the code (`controllers/rbac.yaml`,
//! `node-agent/rbac.yaml`). A missing verb breaks the component; an extra one is privilege
//! nobody needs.

use std::{collections::BTreeSet, path::PathBuf};

use serde::Deserialize;

#[derive(Deserialize)]
struct Rule {
    #[serde(rename = "apiGroups", default)]
    api_groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(rename = "nonResourceURLs", default)]
    non_resource_urls: Vec<String>,
}

#[derive(Deserialize)]
struct Needs {
    cluster: Vec<Rule>,
    namespace: Vec<Rule>,
}

type Grants = BTreeSet<(String, String, String)>;

fn flatten<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> Grants {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in &r.api_groups {
            for res in &r.resources {
                for v in &r.verbs {
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
        // A non-resource URL as the group "nonResourceURL" and the URL as the resource.
        for url in &r.non_resource_urls {
            for v in &r.verbs {
                out.insert(("nonResourceURL".into(), url.clone(), v.clone()));
            }
        }
    }
    out
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The rules the rendered chart grants one component: (ClusterRole rules, Role rules).
fn rendered(docs: &[serde_norway::Value], component: &str) -> (Grants, Grants) {
    let mut cluster = BTreeSet::new();
    let mut namespaced = BTreeSet::new();
    for d in docs {
        let kind = d["kind"].as_str().unwrap_or_default();
        if d["metadata"]["labels"]["app.kubernetes.io/component"].as_str() != Some(component) {
            continue;
        }
        let rules: Vec<Rule> = match d.get("rules") {
            Some(r) => serde_norway::from_value(r.clone()).expect("rules parse"),
            None => continue,
        };
        match kind {
            "ClusterRole" => cluster.extend(flatten(&rules)),
            "Role" => namespaced.extend(flatten(&rules)),
            _ => {}
        }
    }
    (cluster, namespaced)
}

#[test]
fn chart_rbac_equals_what_the_code_calls() {
    let Some(docs) = testkit::chart::render(&[]) else {
        testkit::skipped(
            "chart_rbac_equals_what_the_code_calls",
            "helm not installed (run .ci/tools.sh)",
        );
        return;
    };

    for (component, file) in [
        ("controller-manager", "controllers/rbac.yaml"),
        ("node-agent", "node-agent/rbac.yaml"),
    ] {
        let needs: Needs =
            serde_norway::from_str(&std::fs::read_to_string(repo().join(file)).unwrap()).unwrap();
        let (cluster, namespaced) = rendered(&docs, component);
        let want_cluster = flatten(&needs.cluster);
        let want_ns = flatten(&needs.namespace);
        assert_eq!(
            cluster,
            want_cluster,
            "{component}: chart ClusterRole differs from {file}\n  extra in chart: {:?}\n  missing from chart: {:?}",
            cluster.difference(&want_cluster).collect::<Vec<_>>(),
            want_cluster.difference(&cluster).collect::<Vec<_>>()
        );
        assert_eq!(
            namespaced, want_ns,
            "{component}: chart Role differs from {file}"
        );
        // Nothing cluster-wide may be a wildcard.
        assert!(
            !cluster
                .iter()
                .any(|(g, r, v)| g == "*" || r == "*" || v == "*"),
            "{component}: wildcard rule"
        );
    }
}
