//! The sysctl admission webhook as cluster tests register it: the chart's own
//! ValidatingWebhookConfiguration and the gate's MutatingWebhookConfiguration, pointed at a
//! controller-manager on 127.0.0.1 and narrowed to one namespace, Nodes that report a kernel
//! (Ready ones for the real scheduler), and pod bindings made the way the scheduler makes them.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{
    Binding, Node, NodeCondition, NodeStatus, NodeSystemInfo, ObjectReference, Pod,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

/// The chart's ValidatingWebhookConfiguration (default values), renamed `name`, each webhook
/// calling `https://<addr><its path>` with `failure_policy`, for pods in `namespace` only (the
/// tests of one binary share an apiserver). No caBundle: the controller-manager patches it in.
/// None without helm.
pub fn chart_configuration(
    name: &str,
    addr: std::net::SocketAddr,
    namespace: &str,
    failure_policy: &str,
) -> Option<ValidatingWebhookConfiguration> {
    let docs = crate::chart::render(&["--show-only", "templates/sysctl-webhook.yaml"])?;
    let doc = docs
        .into_iter()
        .find(|d| d["kind"].as_str() == Some("ValidatingWebhookConfiguration"))
        .expect("the chart renders the webhook configuration");
    let mut config: ValidatingWebhookConfiguration =
        serde_norway::from_value(doc).expect("a ValidatingWebhookConfiguration");
    config.metadata = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    for w in config.webhooks.iter_mut().flatten() {
        let path = w
            .client_config
            .service
            .as_ref()
            .and_then(|s| s.path.clone())
            .expect("the chart's webhooks call a Service path");
        w.client_config = WebhookClientConfig {
            url: Some(format!("https://{addr}{path}")),
            ..Default::default()
        };
        w.failure_policy = Some(failure_policy.into());
        w.namespace_selector = Some(LabelSelector {
            match_labels: Some(
                [(
                    "kubernetes.io/metadata.name".to_string(),
                    namespace.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        });
    }
    Some(config)
}

/// A Node with `labels`, reporting `kernel` as kubelet does (`status.nodeInfo`), if any.
pub fn node(name: &str, labels: BTreeMap<String, String>, kernel: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        status: kernel.map(|k| NodeStatus {
            node_info: Some(NodeSystemInfo {
                kernel_version: k.into(),
                operating_system: "linux".into(),
                architecture: "amd64".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Binds pod `namespace/pod` to `node` through `pods/binding`, as the scheduler's default
/// binder does (with the pod's UID); the apiserver's refusal is the error.
pub async fn bind(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
    node: &str,
) -> Result<(), kube::Error> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create_subresource::<_, serde_json::Value>(
            "binding",
            &name,
            &PostParams::default(),
            &binding(namespace, pod, node),
        )
        .await
        .map(|_| ())
}

/// The same through the older `bindings` resource (`POST .../namespaces/NS/bindings`).
pub async fn bind_legacy(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
    node: &str,
) -> Result<(), kube::Error> {
    // The answer is a Status, not a Binding: read as plain JSON.
    let body =
        serde_json::to_vec(&binding(namespace, pod, node)).map_err(kube::Error::SerdeError)?;
    let req = http::Request::post(format!("/api/v1/namespaces/{namespace}/bindings"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(kube::Error::HttpError)?;
    client.request::<serde_json::Value>(req).await.map(|_| ())
}

fn binding(namespace: &str, pod: &Pod, node: &str) -> Binding {
    let name = pod.metadata.name.clone().unwrap_or_default();
    Binding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.into()),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..Default::default()
        },
    }
}

/// The chart's MutatingWebhookConfiguration of the sysctl scheduling gate, renamed `name`,
/// calling `https://<addr>/mutate/pod` with the chart's failurePolicy (Fail), for pods in
/// `namespace` only. No caBundle: the controller-manager patches it in. None without helm.
pub fn chart_gate_configuration(
    name: &str,
    addr: std::net::SocketAddr,
    namespace: &str,
) -> Option<MutatingWebhookConfiguration> {
    let docs = crate::chart::render(&["--show-only", "templates/sysctl-webhook.yaml"])?;
    let doc = docs
        .into_iter()
        .find(|d| d["kind"].as_str() == Some("MutatingWebhookConfiguration"))
        .expect("the chart renders the gate's configuration");
    let mut config: MutatingWebhookConfiguration =
        serde_norway::from_value(doc).expect("a MutatingWebhookConfiguration");
    config.metadata = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    for w in config.webhooks.iter_mut().flatten() {
        w.client_config = WebhookClientConfig {
            url: Some(format!("https://{addr}/mutate/pod")),
            ..Default::default()
        };
        w.namespace_selector = Some(only(namespace));
    }
    Some(config)
}

fn only(namespace: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            [(
                "kubernetes.io/metadata.name".to_string(),
                namespace.to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

/// A Node the scheduler places pods on: Ready, with room for 110 pods, `labels`, a kubelet of
/// `kubelet` and kernel `kernel` in `status.nodeInfo`.
pub fn ready_node(
    name: &str,
    labels: BTreeMap<String, String>,
    kernel: &str,
    kubelet: &str,
) -> Node {
    let mut n = node(name, labels, Some(kernel));
    let status = n.status.get_or_insert_with(Default::default);
    if let Some(info) = status.node_info.as_mut() {
        info.kubelet_version = kubelet.into();
    }
    let room: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity("8".into())),
        ("memory".to_string(), Quantity("32Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
    ]
    .into();
    status.allocatable = Some(room.clone());
    status.capacity = Some(room);
    status.conditions = Some(vec![NodeCondition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: Some("KubeletReady".into()),
        ..Default::default()
    }]);
    n
}
