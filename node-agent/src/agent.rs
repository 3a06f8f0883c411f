//! The node-agent's flags and subcommands: the one place that knows every task's Args.

use clap::{Args, Subcommand};
use groundskeeper_plumbing::cli::{Binary, Part, Selection, parse_selection};

use crate::conntrack::ConntrackArgs;

pub const NAME: &str = "node-agent";
pub const ABOUT: &str =
    "groundskeeper node-agent: stale UDP conntrack cleanup and sysctl admission for one node";

pub type Cli = Binary<Command, AgentArgs>;

/// The agent's own flags (the common ones are in [`Binary`]).
#[derive(Args, Debug)]
#[command(next_help_heading = "Node agent")]
pub struct AgentArgs {
    /// Name of the Node this agent runs on. Set it from the downward API
    /// (env NODE_NAME valueFrom fieldRef spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// Node tasks to run, comma-separated: conntrack, sysctl; `*` for all, `-name` to leave
    /// one out (the controller-manager's --controllers syntax). Empty: none.
    #[arg(long, env = "GROUNDSKEEPER_TASKS", default_value = "conntrack,sysctl",
          value_parser = parse_tasks, allow_hyphen_values = true)]
    pub tasks: Selection,

    #[command(flatten)]
    pub conntrack: ConntrackArgs,

    #[command(flatten)]
    pub sysctl: crate::sysctlreport::SysctlArgs,
}

pub const TASKS: &[Part] = &[
    Part {
        name: "conntrack",
        aliases: &[],
    },
    Part {
        name: "sysctl",
        aliases: &[],
    },
];

fn parse_tasks(s: &str) -> Result<Selection, String> {
    parse_selection(s, TASKS).map(Selection)
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the CustomResourceDefinitions this agent reads (SysctlPolicy) as YAML.
    Crd,
    /// Sysctl admission tools.
    #[command(subcommand)]
    Sysctl(SysctlCommand),
    /// Write the conntrack sysctls given as flags (as kube-proxy does at start-up) and exit:
    /// the chart runs this in a privileged init container so that the agent itself never needs
    /// privilege. A write that fails is logged and the rest go on, as in the agent (exit 0);
    /// exit 2 on bad flags. Honours --dry-run (logs, writes nothing).
    ConntrackSysctls(crate::conntrack::tuning::ConntrackSysctlArgs),
}

#[derive(Subcommand, Debug)]
pub enum SysctlCommand {
    /// Say, per pod in a manifest, whether this agent (and kubelet) would admit it; exit 0 when
    /// all are admitted, 1 when any is rejected, 2 on unusable input. No cluster needed.
    Check(crate::sysctlreport::check::CheckArgs),
}

impl AgentArgs {
    /// The node name, or the message that says how to set it.
    pub fn require_node_name(&self) -> Result<String, String> {
        match self.node_name.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => Ok(n.to_string()),
            _ => Err("NODE_NAME is not set: node-agent must know which Node it runs on. In a pod, set \
                      env NODE_NAME from the downward API (valueFrom.fieldRef.fieldPath: spec.nodeName); \
                      out of cluster, export NODE_NAME=<node> or pass --node-name <node>."
                .into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::cli::CommandLine;

    /// Every task reports its Events as `groundskeeper.dev/<its --tasks name>`.
    #[test]
    fn each_task_reports_under_its_own_name() {
        use crate::context::{CONNTRACK_REPORTER, SYSCTL_REPORTER};
        use groundskeeper_plumbing::events::{is_reporting_controller, reporting_controller};
        let reporters = [
            ("conntrack", CONNTRACK_REPORTER),
            ("sysctl", SYSCTL_REPORTER),
        ];
        for part in TASKS {
            let (_, reporter) = reporters
                .iter()
                .find(|(name, _)| *name == part.name)
                .unwrap_or_else(|| panic!("{}: no reporter listed", part.name));
            assert_eq!(*reporter, reporting_controller(part.name), "{}", part.name);
            assert!(is_reporting_controller(reporter), "{reporter}");
        }
        assert_eq!(reporters.len(), TASKS.len());
    }

    /// Hostile or unrelated environment: no flag, in any subcommand, falls back to an unprefixed variable other than
    /// the downward-API ones.
    #[test]
    fn env_fallbacks_are_prefixed() {
        use clap::CommandFactory;
        assert_eq!(
            testkit::cli::unprefixed_env(&Cli::command()),
            Vec::<String>::new()
        );
        assert_eq!(
            testkit::cli::ungrouped_flags(&Cli::command()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn tasks_take_the_controllers_syntax() {
        let tasks = |f: &str| Cli::from_command_line(&[f]).map(|c| c.tasks.0.clone());
        assert_eq!(tasks("--tasks=*"), Ok(vec!["conntrack", "sysctl"]));
        assert_eq!(tasks("--tasks=*,-sysctl"), Ok(vec!["conntrack"]));
        assert_eq!(tasks("--tasks="), Ok(vec![]));
        let e = tasks("--tasks=*,-dns").unwrap_err();
        assert!(e.contains("\"dns\"") && e.contains("--tasks"), "{e}");
    }

    #[test]
    fn node_name_is_required_and_not_blank() {
        let cli = Cli::from_command_line(&["--node-name", "  "]).unwrap();
        let e = cli.require_node_name().unwrap_err();
        assert!(
            e.contains("NODE_NAME") && e.contains("spec.nodeName"),
            "{e}"
        );
        let cli = Cli::from_command_line(&["--node-name", "worker-1"]).unwrap();
        assert_eq!(cli.require_node_name().unwrap(), "worker-1");
    }

    #[test]
    fn conntrack_sysctls_subcommand_takes_the_sysctl_flags() {
        let cli = Cli::from_command_line(&[
            "--dry-run=true",
            "conntrack-sysctls",
            "--conntrack-max-per-core=32768",
            "--conntrack-tcp-be-liberal=true",
        ])
        .unwrap();
        assert!(cli.common.dry_run);
        let Some(Command::ConntrackSysctls(a)) = cli.command else {
            panic!("{:?}", cli.command);
        };
        assert_eq!(a.conntrack_max_per_core, Some(32768));
        assert!(a.conntrack_tcp_be_liberal);
        assert!(
            Cli::from_command_line(&["conntrack-sysctls", "--conntrack-udp-timeout=0s"]).is_err()
        );
    }
}
