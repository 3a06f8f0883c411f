//! The controller-manager's flags and subcommands: the one place that knows every controller's
//! Args.

use std::time::Duration;

use clap::{Args, Subcommand};
use groundskeeper_plumbing::{
    cli::{Binary, Part, Selection, parse_selection},
    client::parse_duration,
};

use groundskeeper_sysctl_rules::args::PolicyArgs;

use crate::{
    podgc::PodGcArgs,
    servicecidr::ServiceCidrArgs,
    sysctl::{placement::PlacementArgs, webhook::WebhookArgs},
};

pub const NAME: &str = "controller-manager";
pub const ABOUT: &str = "groundskeeper controller-manager: ServiceCIDR and PodGC controllers, one active replica through a Lease; the sysctl admission webhook on every replica";

pub type Cli = Binary<Command, ManagerArgs>;

/// The manager's own flags (the common ones are in [`Binary`]). `--help` shows them grouped by
/// component, each flattened struct under its own heading.
#[derive(Args, Debug)]
#[command(next_help_heading = "Controllers")]
pub struct ManagerArgs {
    /// Controllers to run, comma-separated, as kube-controller-manager's --controllers:
    /// `servicecidr` (or service-cidr-controller), `podgc` (or pod-garbage-collector-controller),
    /// `sysctlplacement` (places the pods the sysctl gate webhook gated), `*` for all, `-name` to leave one out (`*,-podgc`); the first mention of a controller
    /// wins. Empty: none.
    #[arg(long, env = "GROUNDSKEEPER_CONTROLLERS", default_value = "servicecidr,podgc",
          value_parser = parse_controllers, allow_hyphen_values = true)]
    pub controllers: Selection,

    #[command(flatten)]
    pub election: ElectionArgs,

    #[command(flatten)]
    pub service_cidr: ServiceCidrArgs,

    #[command(flatten)]
    pub podgc: PodGcArgs,

    #[command(flatten)]
    pub placement: PlacementArgs,

    /// The sysctl admission webhook (every replica, not only the leader).
    #[command(flatten)]
    pub webhook: WebhookArgs,

    /// The node policy flags the webhook and the placement judge by: the node-agent's, passed the same values.
    #[command(flatten)]
    pub sysctl: PolicyArgs,
}

/// The controllers, by our name and kube-controller-manager's (its canonical name, then its
/// older alias where it has one).
pub const CONTROLLERS: &[Part] = &[
    Part {
        name: "servicecidr",
        aliases: &["service-cidr-controller"],
    },
    Part {
        name: "podgc",
        aliases: &["pod-garbage-collector-controller"],
    },
    Part {
        name: "sysctlplacement",
        aliases: &[],
    },
];

#[derive(Subcommand, Debug)]
pub enum Command {
    /// ServiceCIDR tools.
    #[command(subcommand)]
    Servicecidr(ServiceCidrCommand),
    /// Remove what the controller-manager leaves behind once its replicas are gone: the Lease,
    /// and its finalizer on ServiceCIDRs where no IP would be orphaned (the chart's post-delete
    /// hook runs it). Exit 0 when done, 2 on errors.
    Uninstall(crate::uninstall::UninstallArgs),
    /// GET each URL until it answers 200 (HTTPS certificates are not verified, as kubelet's
    /// probes do not): what the chart's helm test asks each admin server's /readyz with. Exit 0
    /// when every URL answered 200, 1 otherwise.
    Probe(groundskeeper_plumbing::serving::probe::ProbeArgs),
}

#[derive(Subcommand, Debug)]
pub enum ServiceCidrCommand {
    /// Print every IPAddress that blocks (or would block) the deletion of ServiceCIDR NAME, and
    /// who owns it, as the controller decides it. Exit 0 when reported (with --exit-code: 1 when
    /// something blocks), 2 on errors (no such ServiceCIDR, API unreachable).
    Blockers(crate::servicecidr::blockers::BlockersArgs),
}

fn parse_controllers(s: &str) -> Result<Selection, String> {
    parse_selection(s, CONTROLLERS).map(Selection)
}

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Leader election")]
pub struct ElectionArgs {
    /// Run only while holding the leader Lease (needed with more than one replica).
    #[arg(long, env = "GROUNDSKEEPER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Name of the coordination.k8s.io/v1 Lease used for leader election.
    #[arg(
        long,
        visible_alias = "leader-elect-resource-name",
        env = "GROUNDSKEEPER_LEADER_ELECT_LEASE_NAME",
        default_value = "groundskeeper-controller-manager"
    )]
    pub leader_elect_lease_name: String,

    /// Namespace of the Lease (defaults to the pod's namespace).
    #[arg(
        long,
        visible_alias = "leader-elect-resource-namespace",
        env = "POD_NAMESPACE",
        default_value = "default"
    )]
    pub leader_elect_namespace: String,

    /// How long a standby waits after the lease last changed before taking it over.
    #[arg(long, env = "GROUNDSKEEPER_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leadership.
    #[arg(long, env = "GROUNDSKEEPER_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How often candidates try to acquire and the leader renews.
    #[arg(long, env = "GROUNDSKEEPER_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// This replica's name in the Lease (a random suffix is appended).
    #[arg(long, env = "POD_NAME")]
    pub leader_elect_identity: Option<String>,

    /// A kubeconfig for the elector's client alone (default: the controllers' one). Hidden:
    /// it exists so fault tests can cut the lease connection while the controllers' writes
    /// still reach the apiserver, the case fencing is for.
    #[arg(long, env = "GROUNDSKEEPER_LEADER_ELECT_KUBECONFIG", hide = true)]
    pub leader_elect_kubeconfig: Option<std::path::PathBuf>,
}

/// Least lease duration − renew deadline accepted.
const MIN_MARGIN: Duration = Duration::from_secs(1);

impl ElectionArgs {
    /// client-go's rule: lease duration > renew deadline > retry period.
    pub fn validate(&self) -> Result<(), String> {
        if self.leader_elect_lease_duration <= self.leader_elect_renew_deadline {
            return Err(format!(
                "--leader-elect-lease-duration {:?} must be greater than --leader-elect-renew-deadline {:?}",
                self.leader_elect_lease_duration, self.leader_elect_renew_deadline
            ));
        }
        // The margin is all a write already on the wire has to land before a standby may take
        // over; the Lease carries whole seconds, so under a second it is no margin at all.
        if self.leader_elect_lease_duration - self.leader_elect_renew_deadline < MIN_MARGIN {
            return Err(format!(
                "--leader-elect-lease-duration {:?} must exceed --leader-elect-renew-deadline {:?} by at least {MIN_MARGIN:?} (the margin for a leader's last writes to land before a standby takes over)",
                self.leader_elect_lease_duration, self.leader_elect_renew_deadline
            ));
        }
        if self.leader_elect_renew_deadline <= self.leader_elect_retry_period {
            return Err(format!(
                "--leader-elect-renew-deadline {:?} must be greater than --leader-elect-retry-period {:?}",
                self.leader_elect_renew_deadline, self.leader_elect_retry_period
            ));
        }
        if self.leader_elect_lease_name.is_empty() {
            return Err("--leader-elect-lease-name must not be empty".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every controller reports its Events as `groundskeeper.dev/<its --controllers name>`, and
    /// no two controllers share a reporter.
    #[test]
    fn each_controller_reports_under_its_own_name() {
        use groundskeeper_plumbing::events::{is_reporting_controller, reporting_controller};
        let reporters = [
            ("servicecidr", crate::servicecidr::REPORTER),
            ("podgc", crate::podgc::notice::CONTROLLER),
            ("sysctlplacement", crate::sysctl::placement::REPORTER),
        ];
        for part in CONTROLLERS {
            let (_, reporter) = reporters
                .iter()
                .find(|(name, _)| *name == part.name)
                .unwrap_or_else(|| panic!("{}: no reporter listed", part.name));
            assert_eq!(*reporter, reporting_controller(part.name), "{}", part.name);
            assert!(is_reporting_controller(reporter), "{reporter}");
        }
        assert_eq!(reporters.len(), CONTROLLERS.len());
    }
    use testkit::cli::CommandLine;

    #[test]
    fn defaults_match_client_go() {
        let cli = Cli::from_command_line(&[]).unwrap();
        assert!(cli.election.leader_elect);
        assert_eq!(
            cli.election.leader_elect_lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            cli.election.leader_elect_renew_deadline,
            Duration::from_secs(10)
        );
        assert_eq!(
            cli.election.leader_elect_retry_period,
            Duration::from_secs(2)
        );
        assert!(cli.election.validate().is_ok());
        assert!(!cli.common.dry_run);
        assert!(cli.controllers.has("servicecidr") && cli.controllers.has("podgc"));
    }

    #[test]
    fn controllers_selection() {
        assert_eq!(
            Cli::from_command_line(&["--controllers="])
                .unwrap()
                .controllers,
            Selection(vec![])
        );
        assert_eq!(
            Cli::from_command_line(&["--controllers", "podgc"])
                .unwrap()
                .controllers,
            Selection(vec!["podgc"])
        );
        assert!(Cli::from_command_line(&["--controllers", "podgc,nope"]).is_err());
    }

    #[test]
    fn inconsistent_timings_are_named() {
        let cli = Cli::from_command_line(&["--leader-elect-renew-deadline", "20s"]).unwrap();
        let e = cli.election.validate().unwrap_err();
        assert!(
            e.contains("--leader-elect-lease-duration") && e.contains("20s"),
            "{e}"
        );
    }

    #[test]
    fn a_margin_under_a_second_is_refused_naming_both_flags() {
        for (lease, renew, ok) in [
            ("15s", "10s", true),
            ("11s", "10s", true),
            ("10.5s", "10s", false),
            ("10900ms", "10s", false),
        ] {
            let cli = Cli::from_command_line(&[
                "--leader-elect-lease-duration",
                lease,
                "--leader-elect-renew-deadline",
                renew,
            ])
            .unwrap();
            match cli.election.validate() {
                Ok(()) => assert!(ok, "{lease}/{renew} accepted"),
                Err(e) => {
                    assert!(!ok, "{lease}/{renew} refused: {e}");
                    assert!(
                        e.contains("--leader-elect-lease-duration")
                            && e.contains("--leader-elect-renew-deadline")
                            && e.contains("margin"),
                        "{e}"
                    );
                }
            }
        }
    }

    fn controllers(flag: &str) -> Result<Vec<&'static str>, String> {
        Cli::from_command_line(&[flag]).map(|c| c.controllers.0.clone())
    }

    /// kube-controller-manager's --controllers: its controller names (canonical, and podgc's
    /// older alias), `*`, `-name`; ours still work.
    #[test]
    fn controllers_take_upstream_names_and_syntax() {
        let both = vec!["servicecidr", "podgc"];
        let all = vec!["servicecidr", "podgc", "sysctlplacement"];
        for (flag, want) in [
            ("--controllers=*", all.clone()),
            (
                "--controllers=service-cidr-controller,pod-garbage-collector-controller",
                both.clone(),
            ),
            (
                "--controllers=*,-pod-garbage-collector-controller",
                vec!["servicecidr", "sysctlplacement"],
            ),
            (
                "--controllers=*,-podgc",
                vec!["servicecidr", "sysctlplacement"],
            ),
            (
                "--controllers=-service-cidr-controller,*",
                vec!["podgc", "sysctlplacement"],
            ),
            ("--controllers=-podgc", vec![]),
            ("--controllers=podgc", vec!["podgc"]),
            ("--controllers=servicecidr,podgc", both.clone()),
        ] {
            assert_eq!(controllers(flag), Ok(want), "{flag}");
        }
        // A value starting with `-` as its own argument, as upstream's users write it.
        let cli = Cli::from_command_line(&["--controllers", "-podgc,*"]).unwrap();
        assert_eq!(cli.controllers.0, vec!["servicecidr", "sysctlplacement"]);
        for (flag, named) in [
            ("--controllers=*,-nodeipam", "nodeipam"),
            (
                "--controllers=garbage-collector-controller",
                "garbage-collector-controller",
            ),
            ("--controllers=podgc,+servicecidr", "+servicecidr"),
        ] {
            let e = controllers(flag).unwrap_err();
            assert!(
                e.contains(&format!("{named:?}")) && e.contains("--controllers"),
                "{flag}: {e}"
            );
        }
    }

    /// kube-controller-manager's flag names where ours differ, as aliases.
    #[test]
    fn upstream_leader_election_flag_names() {
        let cli = Cli::from_command_line(&[
            "--leader-elect-resource-name=kcm-lease",
            "--leader-elect-resource-namespace=kube-system",
        ])
        .unwrap();
        assert_eq!(cli.election.leader_elect_lease_name, "kcm-lease");
        assert_eq!(cli.election.leader_elect_namespace, "kube-system");
        let cli = Cli::from_command_line(&["--leader-elect-resource-name", "x"]).unwrap();
        assert_eq!(cli.election.leader_elect_lease_name, "x");
        // Upstream's Go durations in the election timings.
        let cli = Cli::from_command_line(&[
            "--leader-elect-lease-duration=1m0s",
            "--leader-elect-renew-deadline=45.5s",
            "--leader-elect-retry-period=2s500ms",
        ])
        .unwrap();
        assert_eq!(
            cli.election.leader_elect_lease_duration,
            Duration::from_secs(60)
        );
        assert_eq!(
            cli.election.leader_elect_renew_deadline,
            Duration::from_millis(45_500)
        );
        assert_eq!(
            cli.election.leader_elect_retry_period,
            Duration::from_millis(2500)
        );
    }

    /// Hostile or unrelated environment: no flag falls back to an unprefixed variable other than the downward-API ones.
    #[test]
    fn env_fallbacks_are_prefixed() {
        use clap::CommandFactory;
        assert_eq!(
            testkit::cli::unprefixed_env(&Cli::command()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn help_groups_every_flag_under_its_component() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        assert_eq!(testkit::cli::ungrouped_flags(&cmd), Vec::<String>::new());
        let heading = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_help_heading())
                .map(str::to_string)
        };
        for (id, want) in [
            ("leader_elect_lease_name", "Leader election"),
            ("gc_period", "PodGC controller"),
            ("service_cidr_workers", "ServiceCIDR controller"),
            ("controllers", "Controllers"),
            ("dry_run", "Process"),
            ("log_format", "Logging"),
            ("kubeconfig", "Kubernetes API client"),
            ("webhook_addr", "Sysctl admission webhook"),
        ] {
            assert_eq!(heading(id).as_deref(), Some(want), "{id}");
        }
    }

    #[test]
    fn leader_elect_can_be_turned_off() {
        assert!(
            !Cli::from_command_line(&["--leader-elect=false"])
                .unwrap()
                .election
                .leader_elect
        );
    }
}
