//! `sysctl check -f FILE`: the pods a manifest holds (a Pod, or the pod template of a
//! Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob, also inside a `List`), each
//! as a Pod with the spec the verdict reads. Pure: text in, pods out.

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use serde::Deserialize;

/// Most documents one manifest may hold: bounded cost on a hostile file.
pub const MAX_PODS: usize = 1000;

/// The pods of `text` (multi-document YAML or JSON), each with a label `Kind/name`; other
/// kinds are skipped. An error names the document.
pub fn pods(text: &str) -> Result<Vec<(String, Pod)>, String> {
    let mut out = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = serde_json::Value::deserialize(doc)
            .map_err(|e| format!("document {}: not valid YAML: {e}", i + 1))?;
        collect(&value, &format!("document {}", i + 1), &mut out)?;
        if out.len() > MAX_PODS {
            return Err(format!("more than {MAX_PODS} pods in one manifest"));
        }
    }
    Ok(out)
}

fn collect(
    value: &serde_json::Value,
    at: &str,
    out: &mut Vec<(String, Pod)>,
) -> Result<(), String> {
    if value.is_null() {
        return Ok(());
    }
    let kind = value["kind"].as_str().unwrap_or_default();
    let (spec, meta) = match kind {
        "Pod" => (&value["spec"], &value["metadata"]),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => (
            &value["spec"]["template"]["spec"],
            &value["spec"]["template"]["metadata"],
        ),
        "CronJob" => (
            &value["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            &value["spec"]["jobTemplate"]["spec"]["template"]["metadata"],
        ),
        "List" => {
            let items = value["items"].as_array().into_iter().flatten();
            for (j, item) in items.enumerate() {
                collect(item, &format!("{at} item {}", j + 1), out)?;
            }
            return Ok(());
        }
        _ => return Ok(()),
    };
    let name = value["metadata"]["name"]
        .as_str()
        .or_else(|| value["metadata"]["generateName"].as_str())
        .unwrap_or("<unnamed>");
    let label = format!("{kind}/{name}");
    let spec: Option<PodSpec> = if spec.is_null() {
        None
    } else {
        Some(
            serde_json::from_value(spec.clone())
                .map_err(|e| format!("{at} ({label}): pod spec does not parse: {e}"))?,
        )
    };
    let mut pod = Pod {
        spec,
        ..Pod::default()
    };
    // A template's annotations (a mirror's) are its pods'.
    pod.metadata.annotations = serde_json::from_value(meta["annotations"].clone()).ok();
    pod.metadata.namespace = value["metadata"]["namespace"].as_str().map(Into::into);
    pod.metadata.name = Some(name.into());
    out.push((label, pod));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysctls(p: &Pod) -> Vec<String> {
        super::super::verdicts::sysctl_names(p.spec.as_ref())
    }

    #[test]
    fn every_kind_with_a_pod_template_is_read_and_others_skipped() {
        let text = r#"
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  securityContext: {sysctls: [{name: kernel.msgmax, value: "1"}]}
  containers: [{name: c, image: i}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  template:
    spec:
      securityContext: {sysctls: [{name: net.core.somaxconn, value: "1"}]}
      containers: [{name: c, image: i}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: skipped}
---
kind: List
items:
- kind: CronJob
  metadata: {name: cj}
  spec: {jobTemplate: {spec: {template: {spec: {containers: [{name: c, image: i}]}}}}}
"#;
        let found = pods(text).unwrap();
        let labels: Vec<&str> = found.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["Pod/p", "Deployment/d", "CronJob/cj"]);
        assert_eq!(sysctls(&found[0].1), ["kernel.msgmax"]);
        assert_eq!(sysctls(&found[1].1), ["net.core.somaxconn"]);
        assert!(sysctls(&found[2].1).is_empty());
    }

    #[test]
    fn bad_input_is_an_error_naming_the_document_not_a_panic() {
        for (text, want) in [
            ("kind: Pod\nspec: [1, 2]\n", "document 1 (Pod/<unnamed>)"),
            ("kind: Pod\n---\n: : :\n  - ]\n", "document 2"),
            (
                "kind: Pod\nspec: {securityContext: {sysctls: 7}}\n",
                "pod spec does not parse",
            ),
        ] {
            let err = pods(text).expect_err(text);
            assert!(err.contains(want), "{text:?}: {err}");
        }
        // Empty input holds no pod, and is no error.
        assert!(pods("").unwrap().is_empty());
    }

    #[test]
    fn a_flood_of_documents_is_refused_at_the_bound() {
        let text = "kind: Pod\nmetadata: {name: p}\n---\n".repeat(MAX_PODS + 5);
        let err = pods(&text).expect_err("over the bound");
        assert!(err.contains("more than"), "{err}");
    }
}
