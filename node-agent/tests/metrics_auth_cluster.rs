//! `--metrics-auth=kubernetes` against a real apiserver: the node-agent
//! serves `/metrics` only to a bearer token whose user RBAC allows `get` on the non-resource
//! URL `/metrics` (TokenReview, then SubjectAccessReview), while `/healthz` and `/readyz` stay
//! open for kubelet's probes.

use std::time::Duration;

use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    core::v1::{Node, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject},
};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use testkit::{Binary, free_addr, unique_name, wait_ready};

fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(Into::into),
        ..Default::default()
    }
}

/// A ServiceAccount in `ns`, bound to `role` when given; a token of it.
async fn token_of(c: &testkit::Cluster, ns: &str, role: Option<&str>) -> anyhow::Result<String> {
    let name = unique_name("scraper");
    c.create(&ServiceAccount {
        metadata: meta(&name, Some(ns)),
        ..Default::default()
    })
    .await?;
    if let Some(role) = role {
        c.create(&ClusterRoleBinding {
            metadata: meta(&name, None),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: role.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.clone(),
                namespace: Some(ns.into()),
                ..Default::default()
            }]),
        })
        .await?;
    }
    let sa: Api<ServiceAccount> = Api::namespaced(c.client.clone(), ns);
    let t = sa
        .create_token_request(&name, &PostParams::default(), &TokenRequest::default())
        .await?;
    Ok(t.status.map(|s| s.token).unwrap_or_default())
}

async fn get(admin: std::net::SocketAddr, path: &str, token: Option<&str>) -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(admin).await?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

#[tokio::test]
async fn metrics_only_to_callers_rbac_allows() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("metrics_only_to_callers_rbac_allows").await else {
        return Ok(());
    };
    c.ensure_crd(&groundskeeper_node_agent::sysctl::crd::crd_yaml())
        .await?;
    let ns = c.namespace("metrics-auth").await?;
    let node = unique_name("gk-metrics");
    c.create(&Node {
        metadata: meta(&node, None),
        ..Default::default()
    })
    .await?;
    // What a Prometheus is bound to (the chart ships it as <release>-metrics-reader).
    let reader = unique_name("metrics-reader");
    c.create(&ClusterRole {
        metadata: meta(&reader, None),
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
        ..Default::default()
    })
    .await?;
    let allowed = token_of(&c, &ns, Some(&reader)).await?;
    let other = token_of(&c, &ns, None).await?;

    let admin = free_addr();
    let admin_s = admin.to_string();
    let _agent = Binary::start(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-metrics-auth",
        &[
            "--admin-addr",
            &admin_s,
            "--tasks=sysctl",
            "--metrics-auth=kubernetes",
        ],
        &[("NODE_NAME", node.as_str())],
    )?;
    wait_ready(admin, Duration::from_secs(60), "readyz without a token").await?;
    assert_eq!(get(admin, "/healthz", None).await?, 200);
    assert_eq!(get(admin, "/metrics", None).await?, 401, "no token");
    assert_eq!(
        get(admin, "/metrics", Some("not-a-token")).await?,
        401,
        "a token the apiserver does not accept"
    );
    assert_eq!(
        get(admin, "/metrics", Some(&other)).await?,
        403,
        "a ServiceAccount RBAC does not allow"
    );
    assert_eq!(
        get(admin, "/metrics", Some(&allowed)).await?,
        200,
        "bound to the metrics reader role"
    );
    Ok(())
}
