//! The chart and the binary agree: the args the chart renders for controller-manager, with
//! defaults and with every option on, parse with the binary's own flag parser.

use clap::Parser;
use groundskeeper_controllers::manager::Cli;

#[test]
fn chart_args_parse() {
    for (case, extra) in [
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
    ] {
        let Some(docs) = testkit::chart::render(&extra) else {
            testkit::skipped("chart_args_parse", "helm not installed (run .ci/tools.sh)");
            return;
        };
        let args = testkit::chart::container_args(&docs, "Deployment");
        let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{case}: {args:?}\n{e}"));
        cli.election
            .validate()
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        match case {
            "everything on" => assert!(cli.common.dry_run),
            "both controllers off" => assert!(cli.controllers.0.is_empty()),
            _ => assert!(
                !cli.common.dry_run
                    && cli.controllers.has("podgc")
                    && cli.controllers.has("servicecidr")
            ),
        }
    }
}
