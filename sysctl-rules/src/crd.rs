//! The SysctlPolicy custom resource.
//!
//! Extra allowed sysctl patterns for the nodes a label selector picks, and whether a forbidden
//! pod is kept off them (Enforce) or only reported (Audit).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt};
use serde::{Deserialize, Serialize};

/// Where the generated CRD is committed, relative to the repository root.
pub const CRD_PATHS: [&str; 2] = [
    "crds/sysctlpolicies.groundskeeper.dev.yaml",
    "charts/groundskeeper/crds/sysctlpolicies.groundskeeper.dev.yaml",
];

/// How to bring the committed copies up to date.
pub const REGENERATE: &str = "make crds";

/// The condition type that says whether every pattern is usable.
pub const CONDITION_VALID: &str = "Valid";

/// Extra sysctls pods on the selected nodes may set, beyond the kernel-gated safe list.
// Two printer columns share `type_ = "string"`, which clippy takes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(
    CustomResource, schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default,
)]
#[kube(
    group = "groundskeeper.dev",
    version = "v1alpha1",
    kind = "SysctlPolicy",
    plural = "sysctlpolicies",
    shortname = "sysctlpol",
    // `kubectl get groundskeeper` lists every policy. Not `all`: that category is for
    // namespaced workload objects, and a cluster-scoped policy there would clutter every
    // `kubectl get all -n NS`.
    category = "groundskeeper",
    status = "SysctlPolicyStatus",
    doc = "Allows unsafe sysctls on the nodes a label selector picks (groundskeeper sysctl policy).",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(
        name = "Patterns",
        type_ = "string",
        json_path = ".spec.allowedUnsafeSysctls"
    ),
    // The Valid condition's status, and its reason when a pattern is refused.
    printcolumn(
        name = "Valid",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Valid")].status"#
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        priority = 1,
        json_path = r#".status.conditions[?(@.type=="Valid")].reason"#
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SysctlPolicySpec {
    /// Sysctl names (`kernel.msgmax`) or prefixes ending in `*` (`net.ipv6.neigh.*`), in dot or
    /// slash form, that pods may set on the selected nodes. Each must be namespaced (IPC or Net).
    #[serde(default)]
    #[schemars(schema_with = "pattern_list")]
    pub allowed_unsafe_sysctls: Vec<String>,

    /// The nodes this policy applies to, by label. Absent or empty: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,

    /// Enforce: the admission webhook keeps a pod whose sysctls are forbidden off the selected
    /// nodes (its binding is denied; it stays Pending). Audit: it is allowed with a warning and
    /// reported once it runs. A pod that has started is never failed, in either mode. Where
    /// several policies select a node, Enforce wins.
    #[serde(default)]
    pub mode: Mode,
}

/// Most patterns a policy may list; bounds the CEL cost estimate.
pub const MAX_PATTERNS: usize = 256;

/// The pattern list's schema: each item is checked at apply time by a CEL rule whose RE2 regex
/// is the upstream pattern syntax (`names::PATTERN_RE2`), and by maxLength. Per item, so the
/// apiserver's error names the bad item's index and the message quotes it.
fn pattern_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let rule = format!("self.matches('{}')", super::names::PATTERN_RE2);
    let message = format!(
        "'sysctl \"' + self + '\" must have at most {} characters and match regex {}'",
        super::names::MAX_LENGTH,
        super::names::PATTERN_REGEX.replace('\\', "\\\\")
    );
    schemars::json_schema!({
        "type": "array",
        "maxItems": MAX_PATTERNS,
        "items": {
            "type": "string",
            "maxLength": super::names::MAX_LENGTH,
            "x-kubernetes-validations": [{
                "rule": rule,
                "messageExpression": message,
                "reason": "FieldValueInvalid",
            }],
        },
    })
}

/// Whether a forbidden pod is kept off the selected nodes (Enforce) or only reported (Audit).
#[derive(
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    clap::ValueEnum,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
)]
pub enum Mode {
    #[default]
    Enforce,
    Audit,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Enforce => "Enforce",
            Mode::Audit => "Audit",
        })
    }
}

/// What the node-agent found of this policy: whether its patterns and node selector are usable.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SysctlPolicyStatus {
    /// `Valid`: True when every pattern is valid and of a known namespace; False names the
    /// bad ones (reason InvalidPatterns) or an unusable node selector (InvalidNodeSelector).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The CRD as YAML, the form committed under `crds/` and the chart. A doc comment's line breaks
/// are only its wrapping: each description is one line per paragraph, which `kubectl explain`
/// wraps to the terminal itself (a hard break at column 95 made ragged lines there).
pub fn crd_yaml() -> String {
    let mut crd = serde_json::to_value(SysctlPolicy::crd()).expect("a CRD serializes");
    unwrap_descriptions(&mut crd);
    let crd: CustomResourceDefinition = serde_json::from_value(crd).expect("still a CRD");
    format!(
        "# Generated from sysctl-rules/src/crd.rs; do not edit. Regenerate: {REGENERATE}\n{}",
        serde_norway::to_string(&crd).expect("a CRD serializes to YAML")
    )
}

/// Joins the lines of each paragraph of every `description` (blank lines stay paragraph breaks).
fn unwrap_descriptions(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    serde_json::Value::String(text) if key == "description" => {
                        *text = text
                            .split("\n\n")
                            .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
                            .collect::<Vec<_>>()
                            .join("\n\n");
                    }
                    _ => unwrap_descriptions(value),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(unwrap_descriptions),
        _ => {}
    }
}
