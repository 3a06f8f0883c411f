//! The chart and the binary agree: the args the chart renders for node-agent, with defaults
//! and with every option on (conntrack sysctls, unsafe sysctls, Enforce by default), parse with
//! the binary's own flag parser and pass its start-up validation.

use clap::Parser;
use groundskeeper_node_agent::agent::Cli;
use groundskeeper_node_agent::sysctl::crd::Mode;

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
        if case == "everything on" {
            assert!(cli.common.dry_run);
            assert_eq!(cli.conntrack.sysctls.conntrack_max_per_core, Some(32768));
        }
    }
}
