//! The chart and the binary agree: the args the chart renders for controller-manager, with
//! defaults and with every option on, parse with the binary's own flag parser.

use std::time::Duration;

use groundskeeper_controllers::{manager::Cli, podgc::Mode};
use testkit::chart;

#[test]
fn chart_args_parse() {
    let Some(rendered) = testkit::chart::render_cases(
        "chart_args_parse",
        &[
            ("defaults", vec![]),
            (
                "everything on",
                vec!["-f", "../charts/groundskeeper/ci/everything-on-values.yaml"],
            ),
            (
                "both controllers off",
                vec![
                    "--set",
                    "controllerManager.serviceCIDR.enabled=false,controllerManager.podGC.enabled=false",
                ],
            ),
            (
                "managed preset",
                vec!["-f", "../charts/groundskeeper/presets/managed-cluster.yaml"],
            ),
            (
                "gate off",
                vec![
                    "--set",
                    "controllerManager.sysctlWebhook.gate.enabled=false",
                ],
            ),
        ],
    ) else {
        return;
    };
    for (case, docs) in rendered {
        let cli: Cli = chart::parse(case, &chart::container_args(&docs, "Deployment"));
        cli.election
            .validate()
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        cli.webhook
            .validate()
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(
            cli.webhook.enabled,
            "{case}: the sysctl webhook is on by default"
        );
        // The name the apiserver calls: the webhook configuration's service, whatever
        // nameOverride or fullnameOverride made of it.
        let service = docs
            .iter()
            .find(|d| d["kind"].as_str() == Some("ValidatingWebhookConfiguration"))
            .map(|d| &d["webhooks"][0]["clientConfig"]["service"])
            .unwrap_or_else(|| panic!("{case}: no ValidatingWebhookConfiguration rendered"));
        let host = format!(
            "{}.{}.svc",
            service["name"].as_str().unwrap_or_default(),
            service["namespace"].as_str().unwrap_or_default()
        );
        assert_eq!(
            cli.webhook.webhook_cert_hosts,
            vec![host],
            "{case}: the certificate is for the name the apiserver calls"
        );
        let timings = (
            cli.election.leader_elect_lease_duration,
            cli.election.leader_elect_renew_deadline,
            cli.election.leader_elect_retry_period,
        );
        if case == "defaults" {
            assert_eq!(
                cli.webhook.webhook_cert_hosts,
                vec!["gk-groundskeeper-webhook.default.svc"]
            );
            assert_eq!(
                timings,
                (
                    Duration::from_secs(15),
                    Duration::from_secs(10),
                    Duration::from_secs(2)
                ),
                "the chart's default leader-election timings are client-go's"
            );
        }
        // The gate's configuration is the one whose caBundle the binary keeps, and the
        // placement controller runs wherever the webhook does, the gate on or off (turning the
        // gate off releases the pods it holds instead of stranding them).
        let gate = docs
            .iter()
            .find(|d| d["kind"].as_str() == Some("MutatingWebhookConfiguration"))
            .and_then(|d| d["metadata"]["name"].as_str())
            .map(String::from);
        assert_eq!(
            cli.webhook.webhook_mutating_configuration, gate,
            "{case}: --webhook-mutating-configuration names the rendered gate"
        );
        let webhook = docs
            .iter()
            .any(|d| d["kind"].as_str() == Some("ValidatingWebhookConfiguration"));
        assert_eq!(
            cli.controllers.has("sysctlplacement"),
            webhook,
            "{case}: the placement runs exactly with the webhook"
        );
        assert!(
            gate.is_none() || webhook,
            "{case}: a gate without the webhook"
        );
        assert_eq!(gate.is_none(), case == "gate off", "{case}");
        if case != "managed preset" {
            assert_eq!(cli.podgc.mode, Mode::All, "{case}: every pass by default");
        }
        match case {
            "everything on" => {
                assert!(cli.common.dry_run);
                assert_eq!(
                    timings,
                    (
                        Duration::from_secs(30),
                        Duration::from_secs(20),
                        Duration::from_secs(4)
                    ),
                    "controllerManager.leaderElection's timings reach the binary"
                );
                assert_eq!(
                    cli.sysctl.allowed_unsafe_sysctls(),
                    vec!["net.core.somaxconn", "kernel.msg*"],
                    "the webhook judges with the node-agent's values"
                );
            }
            "both controllers off" => assert_eq!(cli.controllers.0, ["sysctlplacement"]),
            // Beside kube-controller-manager's PodGC: none of upstream's four passes runs.
            "managed preset" => {
                assert_eq!(cli.podgc.mode, Mode::TtlOnly);
                assert_eq!(cli.controllers.0, ["podgc", "sysctlplacement"]);
            }
            _ => assert!(
                !cli.common.dry_run
                    && cli.controllers.has("podgc")
                    && cli.controllers.has("servicecidr")
            ),
        }
    }
}

/// The sysctls the chart's webhooks never see (matchConditions `not-only-safe-sysctls` of the
/// gate and of the webhook on pods created on their node) are exactly those every supported
/// kubelet allows on every kernel: a pod setting only those has nothing Enforce could refuse,
/// and an outage of groundskeeper must not affect it.
#[test]
fn the_webhooks_skip_exactly_the_sysctls_safe_everywhere() {
    use groundskeeper_sysctl_rules::kubelet::Kubelet;
    let Some(docs) = chart::render(&[]) else {
        return testkit::skipped(
            "the_webhooks_skip_exactly_the_sysctls_safe_everywhere",
            "no helm",
        );
    };
    let mut want: Vec<String> = Kubelet::OLDEST
        .safe_sysctls(None)
        .into_iter()
        .map(String::from)
        .collect();
    want.sort();
    let mut seen = 0;
    for d in &docs {
        for w in d["webhooks"].as_sequence().into_iter().flatten() {
            for c in w["matchConditions"].as_sequence().into_iter().flatten() {
                if c["name"].as_str() != Some("not-only-safe-sysctls") {
                    continue;
                }
                let e = c["expression"].as_str().unwrap();
                let list = &e[e.find('[').unwrap() + 1..e.rfind(']').unwrap()];
                let mut names: Vec<String> = list
                    .split(',')
                    .map(|n| n.trim().trim_matches('\'').to_string())
                    .collect();
                names.sort();
                assert_eq!(names, want, "{}", w["name"].as_str().unwrap_or_default());
                seen += 1;
            }
        }
    }
    assert_eq!(
        seen, 2,
        "the gate and the pod webhook each skip the safe sysctls"
    );
}
