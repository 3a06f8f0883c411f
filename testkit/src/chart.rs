//! The Helm chart rendered by the real `helm`, for tests that check it against the code.

use std::{path::PathBuf, process::Command};

use serde::Deserialize;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The pinned helm from `.ci/tools.sh`, else one on PATH.
pub fn helm() -> Option<PathBuf> {
    let local = repo().join(".tools/bin/helm");
    if local.exists() {
        return Some(local);
    }
    Command::new("helm")
        .arg("version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "helm".into())
}

/// `helm template gk charts/groundskeeper <extra>` as YAML documents; None without helm.
/// Panics (failing the test) when helm refuses the chart.
pub fn render(extra: &[&str]) -> Option<Vec<serde_norway::Value>> {
    render_release("gk", extra)
}

/// [`render`] under another release name (so cluster-scoped names do not clash).
pub fn render_release(release: &str, extra: &[&str]) -> Option<Vec<serde_norway::Value>> {
    let helm = helm()?;
    let out = Command::new(helm)
        .args(["template", release])
        .arg(repo().join("charts/groundskeeper"))
        .args(extra)
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("helm prints UTF-8");
    Some(
        serde_norway::Deserializer::from_str(&text)
            .map(|d| serde_norway::Value::deserialize(d).expect("helm renders YAML"))
            .filter(|d| !d.is_null())
            .collect(),
    )
}

/// The args of the first container of the workload of `kind` (Deployment, DaemonSet), with
/// the program name in front, ready for `Cli::try_parse_from`.
pub fn container_args(docs: &[serde_norway::Value], kind: &str) -> Vec<String> {
    args_of(docs, kind, "containers")
}

/// The same for the workload's first init container.
pub fn init_container_args(docs: &[serde_norway::Value], kind: &str) -> Vec<String> {
    args_of(docs, kind, "initContainers")
}

fn args_of(docs: &[serde_norway::Value], kind: &str, list: &str) -> Vec<String> {
    let doc = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("the chart renders no {kind}"));
    let container = &doc["spec"]["template"]["spec"][list][0];
    let mut args = vec![
        container["command"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{kind} has no {list}[0].command"))
            .to_string(),
    ];
    args.extend(
        container["args"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().expect("args are strings").to_string()),
    );
    args
}

/// Parses `args` (from [`container_args`]) with the binary's own parser; a refusal fails the
/// test naming `case` and the args.
pub fn parse<P: clap::Parser>(case: &str, args: &[String]) -> P {
    P::try_parse_from(args).unwrap_or_else(|e| panic!("{case}: {args:?}\n{e}"))
}

/// Each case's values rendered; `None`, after a `SKIPPED` line for `test`, without helm.
pub fn render_cases<'a>(
    test: &str,
    cases: &[(&'a str, Vec<&str>)],
) -> Option<Vec<(&'a str, Vec<serde_norway::Value>)>> {
    let mut out = Vec::new();
    for (case, extra) in cases {
        let Some(docs) = render(extra) else {
            crate::skipped(test, "helm not installed (run .ci/tools.sh)");
            return None;
        };
        out.push((*case, docs));
    }
    Some(out)
}

/// The rules of every rendered `kind` (ClusterRole or Role) of `component` (the
/// `app.kubernetes.io/component` label; None: any), for a ServiceAccount bound to exactly what
/// the chart grants.
pub fn rules(
    docs: &[serde_norway::Value],
    kind: &str,
    component: Option<&str>,
) -> Vec<k8s_openapi::api::rbac::v1::PolicyRule> {
    docs.iter()
        .filter(|d| {
            d["kind"].as_str() == Some(kind)
                && component.is_none_or(|c| {
                    d["metadata"]["labels"]["app.kubernetes.io/component"].as_str() == Some(c)
                })
        })
        .flat_map(|d| serde_norway::from_value::<Vec<_>>(d["rules"].clone()).expect("rules"))
        .collect()
}
