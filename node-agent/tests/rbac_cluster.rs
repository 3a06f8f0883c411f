//! The least-privilege rules in `node-agent/rbac.yaml` (which the chart grants, see
//! testkit/tests/chart_rbac.rs) are enough: node-agent, acting as a ServiceAccount bound to
//! exactly those rules, lists everything it watches, reports a pod that ran with a forbidden
//! sysctl (its event), and reads the ServiceAccount issuer's keys for `/metrics` (a forged token
//! refused by them), with no "forbidden" from the apiserver.

use std::{path::PathBuf, time::Duration};

use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Node, Pod, PodSecurityContext, ServiceAccount, Sysctl};
use k8s_openapi::api::events::v1::Event;
use kube::{Api, api::ObjectMeta};
use testkit::{Binary, free_addr, unique_name, wait_for, wait_ready};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_listed_rules_are_enough() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("the_listed_rules_are_enough").await else {
        return Ok(());
    };
    c.ensure_crd(&groundskeeper_node_agent::sysctlreport::crd::crd_yaml())
        .await?;
    let ns = c.namespace("rbac").await?;
    let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rbac.yaml");
    let kubeconfig = c.as_service_account(&ns, &rules).await?;
    let node = c
        .create(&Node {
            metadata: ObjectMeta {
                name: Some(unique_name("gk-rbac")),
                ..Default::default()
            },
            ..Default::default()
        })
        .await?
        .metadata
        .name
        .unwrap();

    // The conntrack task too when a namespace of our own can hold its table (never the host's).
    let table = if netns::unavailable().is_none() {
        Some(NetNs::create("rbac")?)
    } else {
        None
    };
    let admin = free_addr();
    // Enforce without a policy, so that the report of a pod that ran is exercised too.
    let mut args = vec![
        "--admin-addr".to_string(),
        admin.to_string(),
        "--sysctl-default-mode=enforce".to_string(),
        "--metrics-auth=kubernetes".to_string(),
    ];
    match &table {
        Some(t) => args.extend([
            "--tasks=conntrack,sysctl".into(),
            "--conntrack-netns".into(),
            t.name.clone(),
        ]),
        None => args.push("--tasks=sysctl".into()),
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Binary::start(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-rbac",
        &refs,
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("NODE_NAME", node.as_str()),
        ],
    )?;
    wait_ready(admin, WAIT, "readyz as the ServiceAccount").await?;

    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let name = unique_name("forbidden");
    let mut pod = testkit::bound_pod(&ns, &name, &node);
    pod.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
        sysctls: Some(vec![Sysctl {
            name: "kernel.msgmax".into(),
            value: "1".into(),
        }]),
        ..Default::default()
    });
    c.create(&pod).await?;
    // kubelet (the test) starts it.
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    pods.patch_status(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            serde_json::json!({"status": {"phase": "Running", "startTime": now}}),
        ),
    )
    .await?;
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns);
    wait_for(WAIT, "the pod reported as having run", || async {
        Ok(events
            .list(&Default::default())
            .await?
            .items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&name)
                    && e.reason
                        .as_deref()
                        .is_some_and(|r| r.starts_with("SysctlForbidden"))
            }))
    })
    .await?;

    // /metrics: a real ServiceAccount token with its signature changed is refused by the
    // issuer's keys, which the agent read with the listed rules.
    let scraper = unique_name("scraper");
    c.create(&ServiceAccount {
        metadata: ObjectMeta {
            name: Some(scraper.clone()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await?;
    let token = Api::<ServiceAccount>::namespaced(c.client.clone(), &ns)
        .create_token_request(&scraper, &Default::default(), &TokenRequest::default())
        .await?
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    let (signed, signature) = token.rsplit_once('.').unwrap();
    let changed = if signature.starts_with('A') { "B" } else { "A" };
    let forged = format!("{signed}.{changed}{}", &signature[1..]);
    let (code, body) = testkit::http_get_as(admin, "/metrics", Some(&forged)).await?;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("signature does not verify"), "{body}");
    assert!(
        !agent
            .logs()
            .contains("could not read the ServiceAccount issuer's keys"),
        "{}",
        agent.logs()
    );

    agent.assert_no_api_refusals();
    Ok(())
}
