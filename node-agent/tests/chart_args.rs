//! The chart and the binary agree: the args the chart renders for node-agent, with defaults
//! and with every option on (conntrack sysctls, unsafe sysctls, Enforce by default), parse with
//! the binary's own flag parser and pass its start-up validation.

use clap::Parser;
use groundskeeper_node_agent::agent::{Cli, Command};
use groundskeeper_node_agent::sysctl::crd::Mode;

/// The conntrack-sysctls init container's command line.
fn init_container_args(docs: &[serde_yaml::Value]) -> Vec<String> {
    let ds = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("DaemonSet"))
        .expect("a DaemonSet");
    let c = &ds["spec"]["template"]["spec"]["initContainers"][0];
    let mut args = vec![c["command"][0].as_str().expect("a command").to_string()];
    args.extend(
        c["args"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().expect("args are strings").to_string()),
    );
    args
}

#[test]
fn chart_args_parse() {
    for (case, extra) in [
        ("defaults", vec![]),
        (
            "everything on",
            vec!["-f", "../charts/groundskeeper/ci/everything-on-values.yaml"],
        ),
    ] {
        let Some(docs) = testkit::chart::render(&extra) else {
            testkit::skipped("chart_args_parse", "helm not installed (run .ci/tools.sh)");
            return;
        };
        let args = testkit::chart::container_args(&docs, "DaemonSet");
        let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{case}: {args:?}\n{e}"));
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
        assert_eq!(cli.sysctl.sysctl_default_mode, want, "{case}");
        // The sysctls go to the privileged init container only, never to the agent.
        assert_eq!(cli.conntrack.sysctls.conntrack_max_per_core, None, "{case}");
        if case == "everything on" {
            assert!(cli.common.dry_run);
            let args = init_container_args(&docs);
            let init = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}\n{e}"));
            assert!(init.common.dry_run);
            let Some(Command::ConntrackSysctls(s)) = init.command else {
                panic!("init container does not run conntrack-sysctls: {args:?}");
            };
            assert_eq!(s.conntrack_max_per_core, Some(32768));
        }
    }
}
