//! An etcd and apiserver outage, replayed against a private etcd + kube-apiserver: both down for
//! 35 s, then back on the same data. With the default flags the agent stays live, turns
//! not-ready past `--watch-stale-after` (30 s), and a new forbidden pod under an Enforce
//! SysctlPolicy is judged within 5 s of the apiserver answering again (kube-runtime's default
//! backoff alone can wait half a minute more), or, when the apiserver serves the SysctlPolicies
//! later than that, within 2 s of it doing so; once kubelet (the test) starts it, it is
//! reported as having run despite the policy.

use std::time::{Duration, Instant};

use groundskeeper_node_agent::sysctlreport::crd::{Mode, SysctlPolicy, SysctlPolicySpec, crd_yaml};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::ObjectMeta;
use testkit::{Binary, metric, unique_name, wait_for, wait_ready};

const NODE_LABEL: &str = "groundskeeper.dev/sysctl-test-node";
const OUTAGE: Duration = Duration::from_secs(35);
const RECOVERY_BOUND: Duration = Duration::from_secs(5);

#[tokio::test]
async fn forbidden_pod_is_judged_within_5s_after_a_35s_control_plane_outage() -> anyhow::Result<()>
{
    let name = "forbidden_pod_is_judged_within_5s_after_a_35s_control_plane_outage";
    let Some((c, cp)) = testkit::private_cluster(name).await else {
        return Ok(());
    };
    c.ensure_crd(&crd_yaml()).await?;
    let ns = c.namespace("sysctl-recovery").await?;
    let node = unique_name("gk-sysctl-node");
    c.create(&Node {
        metadata: ObjectMeta {
            name: Some(node.clone()),
            labels: Some([(NODE_LABEL.to_string(), node.clone())].into()),
            ..Default::default()
        },
        ..Default::default()
    })
    .await?;
    c.create(&SysctlPolicy::new(
        &unique_name("gk-sysctl"),
        SysctlPolicySpec {
            allowed_unsafe_sysctls: vec!["kernel.msg*".into()],
            node_selector: Some(LabelSelector {
                match_labels: Some([(NODE_LABEL.to_string(), node.clone())].into()),
                ..Default::default()
            }),
            mode: Mode::Enforce,
        },
    ))
    .await?;

    let kubeconfig = cp.kubeconfig.display().to_string();
    // Default watch flags: --watch-stale-after=30s, --watch-backoff-max=2s.
    let (agent, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-sysctl-recovery",
        &["--tasks", "sysctl", "--kernel-version", "6.1.0-18-amd64"],
        &[("NODE_NAME", &node), ("KUBECONFIG", &kubeconfig)],
    )?;
    wait_ready(admin, Duration::from_secs(30), "node-agent ready").await?;
    agent
        .wait_for_log("sysctl policy for this node", Duration::from_secs(10))
        .await?;

    cp.stop_apiserver();
    cp.stop_etcd();
    let down = Instant::now();
    let first_503 = testkit::ride_out_outage(admin, down, OUTAGE).await;
    let first_503 = first_503.ok_or_else(|| {
        anyhow::anyhow!("/readyz stayed 200 through a {OUTAGE:?} outage (bound 30 s)")
    })?;
    assert!(
        first_503 >= Duration::from_secs(29),
        "/readyz went 503 {first_503:?} into the outage, before the 30 s bound"
    );
    cp.start_etcd()?;
    cp.start_apiserver()?;
    let up = Instant::now();

    let pod_name = unique_name("sem");
    let mut pod = testkit::bound_pod(&ns, &pod_name, &node);
    pod.spec.as_mut().expect("spec").security_context = Some(testkit::sysctls(&["kernel.sem"]));
    c.create(&pod).await?;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    // After an etcd restart the apiserver serves custom resources a few seconds after its
    // /readyz says 200 (their watch cache initializes lazily); the agent can not know the
    // policies before that, and must not fail pods on a possibly stale list: measured apart.
    let policies: Api<SysctlPolicy> = Api::all(c.client.clone());
    let (judged, policies_served) = tokio::join!(
        async {
            wait_for(2 * RECOVERY_BOUND, "forbidden pod judged", || async {
                Ok(metric(admin, "groundskeeper_sysctl_pods_checked_total")
                    .await?
                    .unwrap_or(0.0)
                    >= 1.0)
            })
            .await
            .map(|_| up.elapsed())
        },
        async {
            wait_for(2 * RECOVERY_BOUND, "SysctlPolicies listed", || async {
                Ok(policies
                    .list(&kube::api::ListParams::default().match_any())
                    .await
                    .is_ok())
            })
            .await
            .map(|_| up.elapsed())
        }
    );
    let (judged, policies_served) = match (judged, policies_served) {
        (Ok(r), Ok(p)) => (r, p),
        (r, p) => anyhow::bail!("{r:?} {p:?}; agent log:\n{}", agent.logs()),
    };
    assert!(
        judged <= RECOVERY_BOUND.max(policies_served + Duration::from_secs(2)),
        "judged {judged:?} after the apiserver was ready, policies served after {policies_served:?}"
    );
    // kubelet starts it: it ran despite the Enforce policy, and is reported so; never failed.
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    pods.patch_status(
        &pod_name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            serde_json::json!({"status": {"phase": "Running", "startTime": now}}),
        ),
    )
    .await?;
    wait_for(RECOVERY_BOUND, "the pod reported as having run", || async {
        Ok(metric(
            admin,
            r#"groundskeeper_sysctl_pods_ran_forbidden_total{mode="Enforce"}"#,
        )
        .await?
            == Some(1.0))
    })
    .await?;
    let phase = pods.get(&pod_name).await?.status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Running"));
    wait_ready(admin, RECOVERY_BOUND, "/readyz 200 after the outage").await?;
    println!(
        "RECOVERY node-agent sysctl after a {OUTAGE:?} etcd+apiserver outage: /readyz 503 after {:.1}s; apiserver ready -> SysctlPolicies served in {:.2}s, forbidden pod judged in {:.2}s, /readyz 200 in {:.2}s",
        first_503.as_secs_f64(),
        policies_served.as_secs_f64(),
        judged.as_secs_f64(),
        up.elapsed().as_secs_f64()
    );
    drop(agent);
    drop(c);
    drop(cp);
    Ok(())
}
