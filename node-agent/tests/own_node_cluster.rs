//! The apiserver, not the agent, keeps a node-agent to its own node's pods: the chart's
//! ValidatingAdmissionPolicy (templates/node-agent-own-node.yaml, rendered here by the real
//! helm, so test and chart can not drift apart) lets the node-agent's ServiceAccount write
//! `pods/status` only for pods whose spec.nodeName is the node its token is bound to.
//!
//! As in a cluster: the chart's ServiceAccount and RBAC, Nodes X and Y, an "agent" pod on X, and
//! a TokenRequest bound to that pod, which is what kubelet mounts into the agent's pod. With that
//! token, a status patch of a pod on Y is refused (403, naming the rule) and one on X allowed; a
//! token of the same ServiceAccount not bound to a pod carries no node name and is refused too.
//!
//! The agent writes no pod (it reports), so the chart's RBAC grants no pod write at
//! all; the test widens it the way a mistake or a later change would, and the policy still
//! confines the writes to the agent's own node.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, SelfSubjectReview, TokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use testkit::{Cluster, unique_name, wait_for};

const WAIT: Duration = Duration::from_secs(30);
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The chart's node-agent documents of `kind`, rendered for `namespace`.
fn chart_docs(docs: &[serde_norway::Value], kind: &str) -> Vec<serde_norway::Value> {
    docs.iter()
        .filter(|d| {
            d["kind"].as_str() == Some(kind)
                && d["metadata"]["labels"]["app.kubernetes.io/component"].as_str()
                    == Some("node-agent")
        })
        .cloned()
        .collect()
}

fn one<K: serde::de::DeserializeOwned>(docs: &[serde_norway::Value], kind: &str) -> K {
    let found = chart_docs(docs, kind);
    assert_eq!(found.len(), 1, "the chart renders one node-agent {kind}");
    serde_norway::from_value(found[0].clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

/// A client that authenticates with `token` only, to the test cluster's server and CA.
async fn token_client(c: &Cluster, token: &str) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(&c.kubeconfig)?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    // The whole auth info is replaced: no client certificate, only the bearer token.
    config.auth_info = serde_json::from_value::<AuthInfo>(serde_json::json!({ "token": token }))?;
    Ok(Client::try_from(config)?)
}

async fn token(c: &Cluster, ns: &str, sa: &str, bound_to: Option<&Pod>) -> anyhow::Result<String> {
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(600),
            bound_object_ref: bound_to.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(p.name_any()),
                uid: p.uid(),
            }),
        },
        ..Default::default()
    };
    let got = Api::<ServiceAccount>::namespaced(c.client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &req)
        .await?;
    Ok(got.status.map(|s| s.token).unwrap_or_default())
}

/// A harmless status write: a condition of our own type.
async fn touch_status(client: &Client, ns: &str, pod: &str) -> Result<Pod, kube::Error> {
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "groundskeeper.dev/own-node-probe", "status": "True"
    }]}});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

fn forbidden_by_rule(r: &Result<Pod, kube::Error>) -> Option<String> {
    match r {
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("(rule own-node-pods)") => {
            Some(e.message.clone())
        }
        _ => None,
    }
}

async fn node(c: &Cluster, prefix: &str) -> anyhow::Result<String> {
    let n = c
        .create(&Node {
            metadata: ObjectMeta {
                name: Some(unique_name(prefix)),
                ..Default::default()
            },
            ..Default::default()
        })
        .await?;
    Ok(n.name_any())
}

#[tokio::test]
async fn node_agent_token_writes_only_its_own_nodes_pods() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("node_agent_token_writes_only_its_own_nodes_pods").await else {
        return Ok(());
    };
    let ns = c.namespace("own-node").await?;
    let Some(docs) = testkit::chart::render(&["-n", &ns]) else {
        testkit::skipped(
            "node_agent_token_writes_only_its_own_nodes_pods",
            "helm not installed (run .ci/tools.sh)",
        );
        return Ok(());
    };

    // The chart's ServiceAccount, ClusterRole and binding, and the policy with its binding.
    // Cluster-scoped names get a unique suffix (test processes share the apiserver); the
    // ServiceAccount keeps the chart's name in our own namespace, which is what the policy's
    // username condition names.
    let suffix = unique_name("t");
    let sa: ServiceAccount = one(&docs, "ServiceAccount");
    let sa = c.create(&sa).await?.name_any();
    let mut role: ClusterRole = one(&docs, "ClusterRole");
    let rules = role.rules.get_or_insert_with(Vec::new);
    assert!(
        !rules.iter().any(|r| r
            .resources
            .iter()
            .flatten()
            .any(|res| res.starts_with("pods/"))
            || r.resources.iter().flatten().any(|res| res == "pods")
                && r.verbs
                    .iter()
                    .any(|v| !["list", "watch"].contains(&v.as_str()))),
        "the chart grants the node-agent a pod write: {rules:?}"
    );
    rules.push(PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["pods/status".into()]),
        verbs: vec!["patch".into()],
        ..Default::default()
    });
    let mut role_binding: ClusterRoleBinding = one(&docs, "ClusterRoleBinding");
    role.metadata.name = Some(format!("{}-{suffix}", role.name_any()));
    role_binding.metadata.name = Some(format!("{}-{suffix}", role_binding.name_any()));
    role_binding.role_ref.name = role.name_any();
    c.create(&role).await?;
    c.create(&role_binding).await?;
    let mut vap: ValidatingAdmissionPolicy = one(&docs, "ValidatingAdmissionPolicy");
    let mut vapb: ValidatingAdmissionPolicyBinding = one(&docs, "ValidatingAdmissionPolicyBinding");
    vap.metadata.name = Some(format!("{}-{suffix}", vap.name_any()));
    vapb.metadata.name = Some(format!("{}-{suffix}", vapb.name_any()));
    vapb.spec.as_mut().expect("binding has a spec").policy_name = Some(vap.name_any());
    c.create(&vap).await?;
    c.create(&vapb).await?;

    let (x, y) = (node(&c, "gk-own-x").await?, node(&c, "gk-own-y").await?);
    let mut agent_pod = testkit::bound_pod(&ns, &unique_name("agent"), &x);
    agent_pod.spec.as_mut().unwrap().service_account_name = Some(sa.clone());
    let agent_pod = c.create(&agent_pod).await?;
    let on_x = c
        .create(&testkit::bound_pod(&ns, &unique_name("on-x"), &x))
        .await?
        .name_any();
    let on_y = c
        .create(&testkit::bound_pod(&ns, &unique_name("on-y"), &y))
        .await?
        .name_any();

    // What kubelet would mount into the agent's pod: a token bound to that pod.
    let bound = token_client(&c, &token(&c, &ns, &sa, Some(&agent_pod)).await?).await?;
    let review = Api::<SelfSubjectReview>::all(bound.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    let extra = user.extra.clone().unwrap_or_default();
    // Printed for the record: which extras this apiserver version puts in a pod-bound token.
    println!(
        "pod-bound token: username {:?}, extra {:?}",
        user.username, extra
    );
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{ns}:{sa}").as_str())
    );
    assert_eq!(
        extra.get(NODE_NAME_EXTRA),
        Some(&vec![x.clone()]),
        "a token bound to a pod on {x} names the node: {extra:?}"
    );

    // The policy takes effect asynchronously (the admission plugin loads it from its informer):
    // poll the write that must be refused until it is, bounded.
    let last = std::sync::Mutex::new(String::new());
    wait_for(
        WAIT,
        "the own-node policy to refuse a write to a pod on Y",
        || async {
            let r = touch_status(&bound, &ns, &on_y).await;
            *last.lock().unwrap() = format!("{r:?}");
            Ok(forbidden_by_rule(&r).is_some())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}; last answer: {}", last.lock().unwrap()))?;
    let denied = forbidden_by_rule(&touch_status(&bound, &ns, &on_y).await)
        .expect("still refused once effective");
    assert!(
        denied.contains(&format!("token bound to node \"{x}\""))
            && denied.contains(&format!("is on node \"{y}\"")),
        "{denied}"
    );

    // Its own node's pod: allowed.
    let written = touch_status(&bound, &ns, &on_x)
        .await
        .map_err(|e| anyhow::anyhow!("a write to a pod on its own node {x} was refused: {e}"))?;
    assert!(
        written
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "groundskeeper.dev/own-node-probe")
    );

    // The same ServiceAccount with a token not bound to a pod: no node name, refused even for
    // the pod on X.
    let unbound = token_client(&c, &token(&c, &ns, &sa, None).await?).await?;
    let r = touch_status(&unbound, &ns, &on_x).await;
    let msg = forbidden_by_rule(&r)
        .unwrap_or_else(|| panic!("an unbound token's write must be refused, got {r:?}"));
    assert!(msg.contains("token bound to node \"\""), "{msg}");

    // Nobody else is affected: the admin still writes the pod on Y.
    touch_status(&c.client, &ns, &on_y).await?;
    Ok(())
}
