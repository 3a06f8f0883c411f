//! The chart and the binary agree: the args the chart renders for node-agent, with defaults
//! and with every option on (conntrack sysctls, unsafe sysctls, Enforce by default, default pod
//! sysctls), parse with the binary's own flag parser and pass its start-up validation.

use groundskeeper_node_agent::agent::{Cli, Command};
use groundskeeper_node_agent::sysctlreport::crd::Mode;
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
        ],
    ) else {
        return;
    };
    for (case, docs) in rendered {
        let cli: Cli = chart::parse(case, &chart::container_args(&docs, "DaemonSet"));
        cli.conntrack
            .validate()
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(
            cli.tasks.has("conntrack") && cli.tasks.has("sysctl"),
            "{case}"
        );
        // A default install only audits; Enforce is an explicit choice.
        let want = if case == "everything on" {
            Mode::Enforce
        } else {
            Mode::Audit
        };
        assert_eq!(cli.sysctl.policy.sysctl_default_mode, want, "{case}");
        // The sysctls go to the privileged init container only, never to the agent.
        assert_eq!(cli.conntrack.tuning.conntrack_max_per_core, None, "{case}");
        // Kubelet's default pod sysctls reach the agent whole, a value's spaces and commas kept.
        let defaults = cli.sysctl.default_pod_sysctls.to_string();
        if case == "everything on" {
            assert_eq!(
                defaults,
                "net.core.somaxconn=1024,net.ipv4.ip_local_reserved_ports=30000-30100,31000,\
                 kernel.sem=250 32000 32 128"
            );
        } else {
            assert_eq!(defaults, "", "{case}");
        }
        if case == "everything on" {
            assert!(cli.common.dry_run);
            let args = chart::init_container_args(&docs, "DaemonSet");
            let init: Cli = chart::parse(case, &args);
            assert!(init.common.dry_run);
            let Some(Command::ConntrackSysctls(s)) = init.command else {
                panic!("init container does not run conntrack-sysctls: {args:?}");
            };
            assert_eq!(s.conntrack_max_per_core, Some(32768));
        }
    }
}
