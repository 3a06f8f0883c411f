//! Sysctl reporting against a real apiserver: the agent runs out of cluster as the node-agent
//! of a Node the test creates. No kubelet: the test plays it, writing a pod's status as kubelet
//! does when it starts the pod (startTime, phase Running, a running container) or rejects it.
//! The agent writes no pod; it reports a forbidden pod once kubelet has started it: as having
//! run despite an Enforce policy (SysctlForbiddenRan), as audited, or as started before the
//! policy. (Keeping pods off the node is the webhook's: controllers/tests/sysctl_webhook_cluster.)
//!
//! Tests that need Enforce without a SysctlPolicy run the agent with
//! `--sysctl-default-mode=enforce`: the default is Audit, so that installing the agent changes
//! nothing for workloads.
//!
//! No sleeps decide an outcome: the agent handles its node's pods in watch order, so once a
//! later pod has been reported, every earlier pod has been decided too.

use std::net::SocketAddr;
use std::time::Duration;

use groundskeeper_node_agent::sysctlreport::crd::{Mode, SysctlPolicy, SysctlPolicySpec, crd_yaml};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, ResourceExt};
use testkit::{Binary, Cluster, metric, unique_name, wait_for, wait_ready};

const WAIT: Duration = Duration::from_secs(30);
const NODE_LABEL: &str = "groundskeeper.dev/sysctl-test-node";

async fn ensure_crd(c: &Cluster) -> anyhow::Result<()> {
    c.ensure_crd(&crd_yaml()).await
}

/// A Node object of our own, labelled so that only this test's policies select it.
async fn node(c: &Cluster) -> anyhow::Result<String> {
    let name = unique_name("gk-sysctl-node");
    c.create(&Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some([(NODE_LABEL.to_string(), name.clone())].into()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await?;
    Ok(name)
}

fn selecting(node: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some([(NODE_LABEL.to_string(), node.to_string())].into()),
        ..Default::default()
    })
}

struct Agent {
    admin: SocketAddr,
    bin: Binary,
}

async fn agent(node: &str, extra: &[&str]) -> anyhow::Result<Agent> {
    let mut args = vec!["--tasks", "sysctl", "--kernel-version", "6.1.0-18-amd64"];
    args.extend_from_slice(extra);
    let (bin, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-sysctl",
        &args,
        &[("NODE_NAME", node)],
    )?;
    wait_ready(admin, WAIT, "node-agent /readyz")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nagent log:\n{}", bin.logs()))?;
    Ok(Agent { admin, bin })
}

async fn pod(
    c: &Cluster,
    ns: &str,
    node: &str,
    prefix: &str,
    sysctls: &[&str],
) -> anyhow::Result<String> {
    let name = unique_name(prefix);
    let mut pod = testkit::bound_pod(ns, &name, node);
    pod.spec
        .as_mut()
        .expect("bound_pod has a spec")
        .security_context = Some(testkit::sysctls(sysctls));
    c.create(&pod).await?;
    Ok(name)
}

async fn policy(
    c: &Cluster,
    node: &str,
    patterns: &[&str],
    mode: Mode,
) -> anyhow::Result<SysctlPolicy> {
    c.create(&SysctlPolicy::new(
        &unique_name("gk-sysctl"),
        SysctlPolicySpec {
            allowed_unsafe_sysctls: patterns.iter().map(|s| s.to_string()).collect(),
            node_selector: selecting(node),
            mode,
        },
    ))
    .await
}

/// (phase, reason, message) of a pod's status.
async fn status(c: &Cluster, ns: &str, name: &str) -> anyhow::Result<(String, String, String)> {
    let p = Api::<Pod>::namespaced(c.client.clone(), ns)
        .get(name)
        .await?;
    let s = p.status.unwrap_or_default();
    Ok((
        s.phase.unwrap_or_default(),
        s.reason.unwrap_or_default(),
        s.message.unwrap_or_default(),
    ))
}

/// The SysctlForbidden and SysctlForbiddenRan events about a pod: (reason, note), all Warnings.
async fn forbidden_events(
    c: &Cluster,
    ns: &str,
    pod: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let events = Api::<Event>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| {
            matches!(
                e.reason.as_deref(),
                Some("SysctlForbidden" | "SysctlForbiddenRan")
            ) && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)
        })
        .flat_map(|e| {
            assert_eq!(e.type_.as_deref(), Some("Warning"), "{e:?}");
            // The recorder folds a repeated event into a series on the first object.
            let times = e.series.as_ref().map_or(1, |s| s.count.max(1)) as usize;
            let item = (e.reason.unwrap_or_default(), e.note.unwrap_or_default());
            std::iter::repeat_n(item, times)
        })
        .collect())
}

async fn wait_event(c: &Cluster, ns: &str, name: &str) -> anyhow::Result<()> {
    wait_for(
        WAIT,
        &format!("a SysctlForbidden event on {name}"),
        || async { Ok(!forbidden_events(c, ns, name).await?.is_empty()) },
    )
    .await?;
    Ok(())
}

async fn assert_untouched(c: &Cluster, ns: &str, name: &str) -> anyhow::Result<()> {
    let (phase, reason, _) = status(c, ns, name).await?;
    anyhow::ensure!(
        phase == "Pending" && reason.is_empty(),
        "pod {name} was touched: phase {phase}, reason {reason}"
    );
    let events = forbidden_events(c, ns, name).await?;
    anyhow::ensure!(events.is_empty(), "pod {name} got events: {events:?}");
    Ok(())
}

/// What the tests that enforce without a policy pass: Enforce has to be chosen.
const ENFORCE_BY_DEFAULT: &str = "--sysctl-default-mode=enforce";

const RAN_ENFORCE: &str = r#"groundskeeper_sysctl_pods_ran_forbidden_total{mode="Enforce"}"#;
const RAN_AUDIT: &str = r#"groundskeeper_sysctl_pods_ran_forbidden_total{mode="Audit"}"#;
const CHECKED: &str = "groundskeeper_sysctl_pods_checked_total";
const RAN: &str = "SysctlForbiddenRan";
const FORBIDDEN: &str = "SysctlForbidden";

/// The note of a pod that ran despite the Enforce policy.
fn ran_note(message: &str) -> String {
    format!(
        "{message}: started on this node although its Enforce sysctl policy forbids it \
         (the admission webhook did not keep it off); not stopped"
    )
}

const STARTED_ENFORCE: &str =
    r#"groundskeeper_sysctl_started_pods_forbidden_total{mode="Enforce"}"#;
const STARTED_AUDIT: &str = r#"groundskeeper_sysctl_started_pods_forbidden_total{mode="Audit"}"#;
const MSGMAX: &str = r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#;

/// Plays kubelet having admitted and started the pod: status with startTime, phase Running and
/// a running container. Returns the pod's resourceVersion after that write.
async fn start_pod(c: &Cluster, ns: &str, name: &str) -> anyhow::Result<String> {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let patch = serde_json::json!({"status": {
        "phase": "Running",
        "startTime": now,
        "containerStatuses": [{
            "name": "c",
            "image": "registry.invalid/none",
            "imageID": "",
            "ready": true,
            "started": true,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }],
    }});
    let p = Api::<Pod>::namespaced(c.client.clone(), ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(p.resource_version().unwrap_or_default())
}

/// The pod must be exactly as kubelet (the test) left it: no write since `rv`, so Running.
async fn assert_not_written(c: &Cluster, ns: &str, name: &str, rv: &str) -> anyhow::Result<()> {
    let p = Api::<Pod>::namespaced(c.client.clone(), ns)
        .get(name)
        .await?;
    let phase = p.status.as_ref().and_then(|s| s.phase.clone());
    anyhow::ensure!(
        p.resource_version().as_deref() == Some(rv) && phase.as_deref() == Some("Running"),
        "started pod {name} was written: resourceVersion {:?} (was {rv}), phase {phase:?}",
        p.resource_version()
    );
    Ok(())
}

/// Waits until the agent's metric has this value (the agent has got that far).
async fn wait_metric(agent: &Agent, name: &str, want: f64) -> anyhow::Result<()> {
    wait_for(WAIT, &format!("{name} = {want}"), || async {
        Ok(metric(agent.admin, name).await? == Some(want))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nagent log:\n{}", agent.bin.logs()))?;
    Ok(())
}

/// Waits until the agent has judged `n` pods (a pending one is judged without any write).
async fn wait_checked(agent: &Agent, n: f64) -> anyhow::Result<()> {
    wait_for(WAIT, &format!("{n} pods checked"), || async {
        Ok(metric(agent.admin, CHECKED).await?.unwrap_or(0.0) >= n)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nagent log:\n{}", agent.bin.logs()))?;
    Ok(())
}

#[tokio::test]
async fn a_forbidden_pod_is_never_failed_and_reported_once_it_ran() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("a_forbidden_pod_is_never_failed_and_reported_once_it_ran").await
    else {
        return Ok(());
    };
    ensure_crd(&c).await?;
    let node = node(&c).await?;
    let ns = c.namespace("sysctl").await?;
    let agent = agent(&node, &[ENFORCE_BY_DEFAULT]).await?;

    let safe = pod(
        &c,
        &ns,
        &node,
        "safe",
        &["kernel.shm_rmid_forced", "net/ipv4/tcp_rmem"],
    )
    .await?;
    let forbidden = pod(
        &c,
        &ns,
        &node,
        "forbidden",
        &["kernel.shm_rmid_forced", "kernel.msgmax"],
    )
    .await?;
    // ReportedKubelet while pending: nothing written (the webhook, not the agent, keeps pods off).
    wait_checked(&agent, 2.0).await?;
    assert_untouched(&c, &ns, &forbidden).await?;
    assert_untouched(&c, &ns, &safe).await?;

    // kubelet admits it (its own allowlist allows it) and starts it: it ran despite Enforce.
    let rv = start_pod(&c, &ns, &forbidden).await?;
    wait_event(&c, &ns, &forbidden).await?;
    assert_eq!(
        forbidden_events(&c, &ns, &forbidden).await?,
        vec![(RAN.to_string(), ran_note(MSGMAX))]
    );
    assert_not_written(&c, &ns, &forbidden, &rv).await?;
    assert_eq!(metric(agent.admin, RAN_ENFORCE).await?, Some(1.0));

    // A policy for this node allows kernel.msg*; kernel.sem stays forbidden.
    let p = policy(&c, &node, &["kernel.msg*"], Mode::Enforce).await?;
    wait_policy_log(&agent, &p.name_any()).await?;
    let allowed = pod(&c, &ns, &node, "allowed", &["kernel.msgmax"]).await?;
    let sem = pod(&c, &ns, &node, "sem", &["kernel.sem"]).await?;
    // safe, forbidden (pending, started, then allowed by the policy), allowed, sem: seen
    // pending before kubelet starts them, so known to start under the policy.
    wait_checked(&agent, 6.0).await?;
    start_pod(&c, &ns, &allowed).await?;
    start_pod(&c, &ns, &sem).await?;
    wait_event(&c, &ns, &sem).await?;
    assert_eq!(forbidden_events(&c, &ns, &allowed).await?, vec![]);
    assert_untouched(&c, &ns, &safe).await?;
    assert_eq!(
        forbidden_events(&c, &ns, &forbidden).await?.len(),
        1,
        "once"
    );
    assert_eq!(metric(agent.admin, RAN_ENFORCE).await?, Some(2.0));

    // The policy's status says it is valid.
    let api: Api<SysctlPolicy> = Api::all(c.client.clone());
    wait_for(WAIT, "policy status Valid=True", || async {
        let p = api.get(&p.name_any()).await?;
        let s = p.status.unwrap_or_default();
        Ok(s.observed_generation == Some(1)
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Valid" && c.status == "True"))
    })
    .await?;
    agent.bin.assert_no_api_refusals();
    Ok(())
}

/// kubelet's own verdict stays: a pod kubelet rejects gets nothing from the agent.
#[tokio::test]
async fn a_pod_kubelet_rejects_is_kubelets_alone() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("a_pod_kubelet_rejects_is_kubelets_alone").await else {
        return Ok(());
    };
    ensure_crd(&c).await?;
    let node = node(&c).await?;
    let ns = c.namespace("sysctl-kubelet").await?;
    let agent = agent(&node, &[ENFORCE_BY_DEFAULT]).await?;
    let refused = pod(&c, &ns, &node, "refused", &["kernel.msgmax"]).await?;
    wait_checked(&agent, 1.0).await?;
    // What kubelet's rejectPod writes.
    let failed = serde_json::json!({"status": {
        "phase": "Failed",
        "reason": "SysctlForbidden",
        "message": format!("Pod was rejected: {MSGMAX}"),
        "startTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    }});
    Api::<Pod>::namespaced(c.client.clone(), &ns)
        .patch_status(&refused, &PatchParams::default(), &Patch::Merge(&failed))
        .await?;
    // A later pod that runs: once it is reported, the rejected one has been seen too.
    let barrier = pod(&c, &ns, &node, "barrier", &["kernel.msgmax"]).await?;
    wait_checked(&agent, 2.0).await?;
    start_pod(&c, &ns, &barrier).await?;
    wait_event(&c, &ns, &barrier).await?;
    assert_eq!(forbidden_events(&c, &ns, &refused).await?, vec![]);
    assert_eq!(metric(agent.admin, RAN_ENFORCE).await?, Some(1.0));
    Ok(())
}

#[tokio::test]
async fn audit_mode_reports_once_a_pod_runs() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("audit_mode_reports_once_a_pod_runs").await else {
        return Ok(());
    };
    ensure_crd(&c).await?;
    let node = node(&c).await?;
    let ns = c.namespace("sysctl-audit").await?;
    policy(&c, &node, &[], Mode::Audit).await?;
    let agent = agent(&node, &[]).await?;

    let first = pod(&c, &ns, &node, "audited", &["kernel.msgmax"]).await?;
    wait_checked(&agent, 1.0).await?;
    assert_untouched(&c, &ns, &first).await?;
    start_pod(&c, &ns, &first).await?;
    wait_event(&c, &ns, &first).await?;
    // Give the agent reasons to look at the first pod again: a pod update and a policy change
    // that does not change its verdict. Neither may produce a second event.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    pods.patch(
        &first,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await?;
    let widened = policy(&c, &node, &["net.ipv4.tcp_wmem"], Mode::Audit).await?;
    wait_policy_log(&agent, &widened.name_any()).await?;
    let second = pod(&c, &ns, &node, "audited", &["net.core.somaxconn"]).await?;
    wait_checked(&agent, 3.0).await?;
    start_pod(&c, &ns, &second).await?;
    wait_event(&c, &ns, &second).await?;

    for (name, note) in [
        (&first, MSGMAX),
        (
            &second,
            r#"forbidden sysctl: "net.core.somaxconn" not allowlisted"#,
        ),
    ] {
        assert_eq!(
            forbidden_events(&c, &ns, name).await?,
            vec![(FORBIDDEN.to_string(), note.to_string())],
            "{name}"
        );
    }
    assert_eq!(metric(agent.admin, RAN_AUDIT).await?, Some(2.0));
    assert_eq!(metric(agent.admin, RAN_ENFORCE).await?, None);
    Ok(())
}

#[tokio::test]
async fn flag_patterns_allow_and_dry_run_touches_nothing() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("flag_patterns_allow_and_dry_run_touches_nothing").await else {
        return Ok(());
    };
    ensure_crd(&c).await?;
    let node = node(&c).await?;
    let ns = c.namespace("sysctl-dry").await?;
    let agent = agent(
        &node,
        &[
            "--dry-run",
            "--log-format",
            "json",
            "--allowed-unsafe-sysctls",
            "net.core.*,kernel.sem",
            ENFORCE_BY_DEFAULT,
        ],
    )
    .await?;

    let allowed = pod(
        &c,
        &ns,
        &node,
        "flag",
        &["net.core.somaxconn", "kernel.sem"],
    )
    .await?;
    let forbidden = pod(&c, &ns, &node, "dry", &["kernel.msgmax"]).await?;
    wait_checked(&agent, 2.0).await?;
    start_pod(&c, &ns, &allowed).await?;
    start_pod(&c, &ns, &forbidden).await?;
    let would_line = "dry-run: would report pod that ran despite the Enforce sysctl policy";
    agent.bin.wait_for_log(would_line, WAIT).await?;
    // The forbidden pod comes after the allowed one, so both are decided by now.
    let would: Vec<serde_json::Value> = agent
        .bin
        .logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| {
            l["msg"]
                .as_str()
                .is_some_and(|m| m.starts_with("dry-run: would"))
        })
        .collect();
    assert_eq!(would.len(), 1, "{would:?}");
    assert_eq!(would[0]["msg"], would_line);
    assert_eq!(would[0]["pod"], forbidden.as_str());
    assert_eq!(would[0]["forbidden"], MSGMAX);
    assert_eq!(forbidden_events(&c, &ns, &forbidden).await?, vec![]);
    assert_eq!(forbidden_events(&c, &ns, &allowed).await?, vec![]);
    assert_eq!(metric(agent.admin, RAN_ENFORCE).await?, Some(1.0));
    Ok(())
}

#[tokio::test]
async fn invalid_policies_are_refused_or_reported() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("invalid_policies_are_refused_or_reported").await else {
        return Ok(());
    };
    ensure_crd(&c).await?;
    let node = node(&c).await?;

    // Malformed: the apiserver's CEL rule refuses it, naming the item.
    let err = policy(&c, &node, &["net.*", "Bad*Pattern"], Mode::Enforce)
        .await
        .expect_err("a malformed pattern must be refused");
    let text = format!("{err:#}");
    assert!(
        text.contains("allowedUnsafeSysctls[1]")
            && text.contains(r#"sysctl "Bad*Pattern" must have at most 253 characters"#),
        "{text}"
    );

    // Well-formed but not namespaced: accepted, and the agent reports it in status.
    let p = policy(&c, &node, &["net.*", "vm.swappiness"], Mode::Enforce).await?;
    let _agent = agent(&node, &[]).await?;
    let api: Api<SysctlPolicy> = Api::all(c.client.clone());
    wait_for(
        WAIT,
        "policy status Valid=False naming vm.swappiness",
        || async {
            let got = api.get(&p.name_any()).await?;
            let s = got.status.unwrap_or_default();
            Ok(s.observed_generation == Some(1)
                && s.conditions.iter().any(|c| {
                    c.type_ == "Valid"
                        && c.status == "False"
                        && c.reason == "InvalidPatterns"
                        && c.message
                            .contains(r#""vm.swappiness" are not known to be namespaced"#)
                        && !c.message.contains("net.*")
                }))
        },
    )
    .await?;

    // Fixed: the condition flips for the new generation.
    api.patch(
        &p.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"allowedUnsafeSysctls": ["net.*"]}})),
    )
    .await?;
    wait_for(
        WAIT,
        "policy status Valid=True for generation 2",
        || async {
            let s = api.get(&p.name_any()).await?.status.unwrap_or_default();
            Ok(s.observed_generation == Some(2)
                && s.conditions.iter().any(|c| {
                    c.type_ == "Valid" && c.status == "True" && c.observed_generation == Some(2)
                }))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn node_labels_decide_which_policies_apply() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("node_labels_decide_which_policies_apply").await else {
        return Ok(());
    };
    ensure_crd(&c).await?;
    let node = node(&c).await?;
    let ns = c.namespace("sysctl-labels").await?;
    let pool = unique_name("pool");
    c.create(&SysctlPolicy::new(
        &unique_name("gk-sysctl"),
        SysctlPolicySpec {
            allowed_unsafe_sysctls: vec!["kernel.msg*".into()],
            node_selector: Some(LabelSelector {
                match_labels: Some(
                    [(
                        "groundskeeper.dev/sysctl-test-pool".to_string(),
                        pool.clone(),
                    )]
                    .into(),
                ),
                ..Default::default()
            }),
            mode: Mode::Enforce,
        },
    ))
    .await?;
    let agent = agent(&node, &[ENFORCE_BY_DEFAULT]).await?;

    // Not selected yet: forbidden.
    let before = pod(&c, &ns, &node, "before", &["kernel.msgmax"]).await?;
    wait_checked(&agent, 1.0).await?;
    start_pod(&c, &ns, &before).await?;
    wait_event(&c, &ns, &before).await?;

    // Labelled into the pool: the policy now applies.
    Api::<Node>::all(c.client.clone())
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"labels": {"groundskeeper.dev/sysctl-test-pool": pool}}
            })),
        )
        .await?;
    wait_policy_log(&agent, "kernel.msg*").await?;
    let after = pod(&c, &ns, &node, "after", &["kernel.msgmax"]).await?;
    let barrier = pod(&c, &ns, &node, "barrier", &["kernel.sem"]).await?;
    // before (pending, started, then allowed by the policy), after, barrier.
    wait_checked(&agent, 5.0).await?;
    start_pod(&c, &ns, &after).await?;
    start_pod(&c, &ns, &barrier).await?;
    wait_event(&c, &ns, &barrier).await?;
    assert_eq!(forbidden_events(&c, &ns, &after).await?, vec![]);
    Ok(())
}

#[tokio::test]
async fn default_install_touches_no_pod_and_reports_only_new_ones_that_run() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("default_install_touches_no_pod_and_reports_only_new_ones_that_run").await
    else {
        return Ok(());
    };
    ensure_crd(&c).await?;
    let node = node(&c).await?;
    let ns = c.namespace("sysctl-default").await?;
    // kubelet admitted and started this one before the agent was installed.
    let running = pod(&c, &ns, &node, "running", &["kernel.msgmax"]).await?;
    let rv = start_pod(&c, &ns, &running).await?;
    // No SysctlPolicy, no flag: the chart's default.
    let agent = agent(&node, &[]).await?;

    // Created after the agent is ready, so handled after the running pod (watch order).
    let pending = pod(&c, &ns, &node, "pending", &["kernel.msgmax"]).await?;
    wait_checked(&agent, 1.0).await?;
    assert_untouched(&c, &ns, &pending).await?;
    start_pod(&c, &ns, &pending).await?;
    wait_event(&c, &ns, &pending).await?;
    assert_eq!(
        forbidden_events(&c, &ns, &pending).await?,
        vec![(FORBIDDEN.to_string(), MSGMAX.to_string())]
    );
    assert_eq!(metric(agent.admin, RAN_AUDIT).await?, Some(1.0));
    assert_eq!(metric(agent.admin, RAN_ENFORCE).await?, None);

    // The pod that ran before: not written, and no event either (nobody chose a policy).
    assert_not_written(&c, &ns, &running, &rv).await?;
    assert_eq!(forbidden_events(&c, &ns, &running).await?, vec![]);
    assert_eq!(metric(agent.admin, STARTED_AUDIT).await?, None);
    Ok(())
}

#[tokio::test]
async fn enforce_policy_never_fails_started_pods_and_reports_once_across_restarts()
-> anyhow::Result<()> {
    let Some(c) = testkit::cluster(
        "enforce_policy_never_fails_started_pods_and_reports_once_across_restarts",
    )
    .await
    else {
        return Ok(());
    };
    ensure_crd(&c).await?;
    let node = node(&c).await?;
    let ns = c.namespace("sysctl-started").await?;
    let running = pod(&c, &ns, &node, "running", &["kernel.msgmax"]).await?;
    let rv = start_pod(&c, &ns, &running).await?;
    let agent1 = agent(&node, &[]).await?;

    // An Enforce policy for this node appears while the pod runs: reported as started before.
    let enforce = policy(&c, &node, &[], Mode::Enforce).await?;
    wait_metric(&agent1, STARTED_ENFORCE, 1.0).await?;
    wait_event(&c, &ns, &running).await?;
    let events = forbidden_events(&c, &ns, &running).await?;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].0 == FORBIDDEN
            && events[0].1.starts_with(MSGMAX)
            && events[0].1.contains("already started"),
        "{events:?}"
    );
    assert_not_written(&c, &ns, &running, &rv).await?;

    // A pod bound under the policy and started by kubelet: not failed, reported as having run.
    let ran = pod(&c, &ns, &node, "ran", &["kernel.msgmax"]).await?;
    wait_checked(&agent1, 2.0).await?;
    let ran_rv = start_pod(&c, &ns, &ran).await?;
    wait_event(&c, &ns, &ran).await?;
    assert_eq!(
        forbidden_events(&c, &ns, &ran).await?,
        vec![(RAN.to_string(), ran_note(MSGMAX))]
    );
    assert_eq!(metric(agent1.admin, RAN_ENFORCE).await?, Some(1.0));

    // The agent restarts under the same policy, and with a flag changed (Enforce by default
    // now): it finds both started pods forbidden again (metric of the new process), but
    // neither writes them nor reports them a second time.
    drop(agent1);
    let agent2 = agent(&node, &[ENFORCE_BY_DEFAULT]).await?;
    wait_metric(&agent2, STARTED_ENFORCE, 2.0).await?;
    assert_eq!(forbidden_events(&c, &ns, &running).await?.len(), 1);
    assert_eq!(forbidden_events(&c, &ns, &ran).await?.len(), 1);
    assert_not_written(&c, &ns, &running, &rv).await?;
    assert_not_written(&c, &ns, &ran, &ran_rv).await?;

    // The policy goes away (the node is Enforce by the flag now): still nothing written.
    Api::<SysctlPolicy>::all(c.client.clone())
        .delete(&enforce.name_any(), &Default::default())
        .await?;
    wait_policy_log(&agent2, "policies=\"\"").await?;
    let barrier = pod(&c, &ns, &node, "barrier", &["kernel.msgmax"]).await?;
    wait_checked(&agent2, 3.0).await?;
    start_pod(&c, &ns, &barrier).await?;
    wait_event(&c, &ns, &barrier).await?;
    assert_not_written(&c, &ns, &running, &rv).await?;
    assert_eq!(forbidden_events(&c, &ns, &running).await?.len(), 1);
    Ok(())
}

/// Waits for the agent to log a node policy containing `needle`.
async fn wait_policy_log(agent: &Agent, needle: &str) -> anyhow::Result<()> {
    wait_for(WAIT, &format!("a node policy with {needle}"), || async {
        Ok(agent
            .bin
            .logs()
            .lines()
            .any(|l| l.contains("sysctl policy for this node") && l.contains(needle)))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", agent.bin.logs()))?;
    Ok(())
}

#[tokio::test]
async fn narrowed_policy_and_relabelled_node_leave_started_pods_alone() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("narrowed_policy_and_relabelled_node_leave_started_pods_alone").await
    else {
        return Ok(());
    };
    ensure_crd(&c).await?;
    let node = node(&c).await?;
    let ns = c.namespace("sysctl-narrow").await?;
    // An Enforce policy allows kernel.msg* on this node; a pod using it was admitted and runs.
    let p = policy(&c, &node, &["kernel.msg*"], Mode::Enforce).await?;
    let running = pod(&c, &ns, &node, "running", &["kernel.msgmax"]).await?;
    let rv = start_pod(&c, &ns, &running).await?;
    let agent = agent(&node, &[]).await?;
    wait_policy_log(&agent, "kernel.msg*").await?;

    // Narrowed: kernel.msgmax is no longer allowed. The running pod is reported, not failed,
    // and not as having run despite the policy: it started before.
    Api::<SysctlPolicy>::all(c.client.clone())
        .patch(
            &p.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"allowedUnsafeSysctls": []}})),
        )
        .await?;
    wait_metric(&agent, STARTED_ENFORCE, 1.0).await?;
    assert_not_written(&c, &ns, &running, &rv).await?;
    let events = forbidden_events(&c, &ns, &running).await?;
    assert!(events.len() == 1 && events[0].0 == FORBIDDEN, "{events:?}");
    assert_eq!(metric(agent.admin, RAN_ENFORCE).await?, None);

    // Relabelled out of the policy's reach: default Audit, nobody's choice; still untouched,
    // and no further event.
    Api::<Node>::all(c.client.clone())
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                NODE_LABEL.to_string(): serde_json::Value::Null
            }}})),
        )
        .await?;
    wait_policy_log(&agent, "policies=\"\"").await?;
    let barrier = pod(&c, &ns, &node, "barrier", &["kernel.msgmax"]).await?;
    // running (allowed, then forbidden), barrier.
    wait_checked(&agent, 3.0).await?;
    start_pod(&c, &ns, &barrier).await?;
    wait_event(&c, &ns, &barrier).await?;
    assert_not_written(&c, &ns, &running, &rv).await?;
    assert_eq!(forbidden_events(&c, &ns, &running).await?.len(), 1);
    Ok(())
}
