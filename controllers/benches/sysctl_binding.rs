//! The binding hot path: every binding in the cluster passes the sysctl webhook, so its cost is
//! paid by every pod. The real kube-scheduler binds ordinary pods (no sysctls: the common case)
//! on fake Ready Nodes of a throwaway control plane, in namespaces the webhook sees and
//! namespaces it does not, in alternating rounds of one run.
//!
//! Prints `bench binding_throughput_ratio R` (pods bound per second with the webhook over
//! without; goal >= 0.95), `bench webhook_p99_ms X` (the webhook's own answer time,
//! histogram_quantile over `groundskeeper_sysctl_admission_review_duration_seconds{subject="binding"}`;
//! goal <= 5), and the apiserver's view of the same calls (round trip, TLS included):
//! `bench webhook_calls_within_5ms_fraction F` from `apiserver_admission_webhook_admission_duration_seconds`.
//!
//! `KUBE_APISERVER=... cargo bench -p groundskeeper-controllers --bench sysctl_binding`
//! (`SYSCTL_BINDING_PODS`, default 1000 per side; kube-scheduler from the node tarball beside
//! kube-apiserver, or `KUBE_SCHEDULER`).

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::components::{self, Component};
use testkit::figures::{bench, env_num};
use testkit::{Binary, free_addr, unique_name, wait_ready, webhook};

const ROUNDS: usize = 2;
const BINDING_WEBHOOK: &str = "binding.sysctl.groundskeeper.dev";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let per_side = env_num("SYSCTL_BINDING_PODS", 1000).max(ROUNDS);
    let Some((c, cp)) = testkit::private_cluster("sysctl_binding").await else {
        println!("SKIPPED sysctl_binding: KUBE_APISERVER not set");
        return Ok(());
    };
    let Some(bin) = components::binary("kube-scheduler")? else {
        println!(
            "SKIPPED sysctl_binding: no kube-scheduler (KUBE_SCHEDULER, or the node tarball beside KUBE_APISERVER)"
        );
        return Ok(());
    };
    // Its client's default 50 QPS would cap both sides alike and hide the webhook's cost.
    let _scheduler =
        Component::scheduler(&bin, &cp, &["--kube-api-qps=1000", "--kube-api-burst=2000"])?;

    let nodes = per_side * 2 / 100 + 2;
    for i in 0..nodes {
        let name = format!("gk-bench-{i}");
        c.create(&webhook::ready_node(
            &name,
            [("bench".to_string(), "1".to_string())].into(),
            "6.1.0",
            "v1.36.2",
        ))
        .await?;
        Api::<Node>::all(c.client.clone())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await?;
    }
    let off = c
        .namespace_for_pods("gk-bench-off", Duration::from_secs(60))
        .await?;
    let on = c
        .namespace_for_pods("gk-bench-on", Duration::from_secs(60))
        .await?;

    // The chart's configurations, narrowed to `on`, served by one controller-manager.
    let addr = free_addr();
    let (vwc, mwc) = (unique_name("gk-sysctl"), unique_name("gk-sysctl-gate"));
    let (Some(validating), Some(mutating)) = (
        webhook::chart_configuration(&vwc, addr, &on, "Ignore"),
        webhook::chart_gate_configuration(&mwc, addr, &on),
    ) else {
        println!("SKIPPED sysctl_binding: helm not installed");
        return Ok(());
    };
    c.create(&validating).await?;
    c.create(&mutating).await?;
    let (gk, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-bench",
        &[
            "--leader-elect=false",
            "--controllers=sysctlplacement",
            "--sysctl-webhook",
            &format!("--webhook-addr={addr}"),
            "--webhook-cert-hosts=127.0.0.1",
            &format!("--webhook-configuration={vwc}"),
            &format!("--webhook-mutating-configuration={mwc}"),
            &format!("--webhook-tls-secret={}", unique_name("gk-webhook-tls")),
        ],
        &[
            ("POD_NAMESPACE", on.as_str()),
            ("KUBECONFIG", &cp.kubeconfig.display().to_string()),
        ],
    )?;
    wait_ready(admin, Duration::from_secs(60), "controller-manager /readyz")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", gk.logs()))?;
    // The caBundle is patched and the apiserver calls the webhook: one pod bound through it.
    bind_round(&c.client, &on, 1, "warm").await?;
    bind_round(&c.client, &off, 1, "warm").await?;

    let (mut with, mut without) = (Duration::ZERO, Duration::ZERO);
    let per_round = per_side / ROUNDS;
    for round in 0..ROUNDS {
        without += bind_round(&c.client, &off, per_round, &format!("r{round}")).await?;
        with += bind_round(&c.client, &on, per_round, &format!("r{round}")).await?;
    }
    let n = (per_round * ROUNDS) as f64;
    let (rate_with, rate_without) = (n / with.as_secs_f64(), n / without.as_secs_f64());
    println!(
        "{} pods per side on {nodes} nodes: {rate_without:.1} bound/s without the webhook, {rate_with:.1} with",
        per_round * ROUNDS
    );
    bench("binding_throughput_ratio", rate_with / rate_without, "");

    let (_, ours) = testkit::http_get(admin, "/metrics").await?;
    let p99 = quantile(
        &buckets(
            &ours,
            "groundskeeper_sysctl_admission_review_duration_seconds_bucket",
            &["subject=\"binding\""],
        ),
        0.99,
    );
    bench("webhook_p99_ms", p99 * 1000.0, "ms");
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let theirs = c.client.request_text(req).await?;
    let round_trip = buckets(
        &theirs,
        "apiserver_admission_webhook_admission_duration_seconds_bucket",
        &[&format!("name=\"{BINDING_WEBHOOK}\"")],
    );
    let total = round_trip.last().map_or(0.0, |(_, n)| *n);
    let within = round_trip
        .iter()
        .find(|(le, _)| (*le - 0.005).abs() < 1e-9)
        .map_or(0.0, |(_, n)| *n);
    println!(
        "apiserver: {within} of {total} calls to {BINDING_WEBHOOK} answered within 5 ms (round trip)"
    );
    bench(
        "webhook_calls_within_5ms_fraction",
        within / total.max(1.0),
        "",
    );
    drop(gk);
    drop(c);
    Ok(())
}

/// Creates `n` ordinary pods in `ns` (32 at a time) and returns how long until all are bound.
async fn bind_round(
    client: &kube::Client,
    ns: &str,
    n: usize,
    tag: &str,
) -> anyhow::Result<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let prefix = unique_name(&format!("b-{tag}"));
    let start = Instant::now();
    let created: Vec<anyhow::Result<()>> = stream::iter(0..n)
        .map(|i| {
            let pods = pods.clone();
            let mut pod = testkit::bound_pod(ns, &format!("{prefix}-{i}"), "");
            pod.spec.as_mut().expect("a spec").node_name = None;
            pod.metadata.labels = Some([("round".to_string(), prefix.clone())].into());
            async move {
                pods.create(&PostParams::default(), &pod)
                    .await
                    .map(drop)
                    .map_err(Into::into)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    created.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let lp = ListParams::default()
        .labels(&format!("round={prefix}"))
        .fields("spec.nodeName!=");
    let deadline = start + Duration::from_secs(600);
    loop {
        let bound = pods.list_metadata(&lp).await?.items.len();
        if bound == n {
            return Ok(start.elapsed());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{bound} of {n} pods in {ns} bound after 600 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The cumulative buckets `(le, count)` of histogram series `name` whose labels contain every
/// one of `labels`, summed over the other labels, by `le` (+Inf last).
fn buckets(text: &str, name: &str, labels: &[&str]) -> Vec<(f64, f64)> {
    let mut by_le: Vec<(f64, f64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(name)) {
        if !labels.iter().all(|l| line.contains(l)) {
            continue;
        }
        let Some(le) = line.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::NAN)
        };
        let Some(count) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        match by_le.iter_mut().find(|(l, _)| *l == le) {
            Some((_, n)) => *n += count,
            None => by_le.push((le, count)),
        }
    }
    by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
    by_le
}

/// Prometheus' histogram_quantile: linear within the bucket the rank falls in.
fn quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map_or(0.0, |(_, n)| *n);
    if total == 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, n) in buckets {
        if n >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let within = if n > prev.1 {
                (rank - prev.1) / (n - prev.1)
            } else {
                0.0
            };
            return prev.0 + (le - prev.0) * within;
        }
        prev = (le, n);
    }
    prev.0
}
