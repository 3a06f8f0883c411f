//! What the webhook carries out: its answers (the one place `--dry-run` turns a denial into a
//! warning) and the gate's patch. The certificate's writes are `tls/apply.rs`.

use super::decide::Decision;
use super::review::Answer;

/// The target of this file's log lines, which `RUST_LOG` filters select by: named after
/// the component (`sysctlwebhook`), wherever its code sits.
const LOG_TARGET: &str = "groundskeeper_controllers::sysctlwebhook::apply";

/// How a decision was answered, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Audited,
    Denied,
    /// Denied by the rules, allowed because of `--dry-run`.
    DryRun,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Audited => "audited",
            Outcome::Denied => "denied",
            Outcome::DryRun => "dry_run",
        }
    }
}

/// The answer for `decision` about `what` (`binding of ns/p to node n1`, for the log line);
/// under `--dry-run` a denial is answered allowed, with the denial as a warning.
pub fn answer(decision: Decision, dry_run: bool, what: &str) -> (Answer, Outcome) {
    match decision {
        Decision::Allow => (
            Answer {
                allowed: true,
                ..Default::default()
            },
            Outcome::Allowed,
        ),
        Decision::Audit { message } => {
            tracing::info!(target: LOG_TARGET, request = what, reason = %message, "allowing forbidden sysctls (audit mode)");
            (
                Answer {
                    allowed: true,
                    message: None,
                    warnings: vec![format!("groundskeeper: {message}")],
                },
                Outcome::Audited,
            )
        }
        Decision::Deny { message } if dry_run => {
            tracing::info!(target: LOG_TARGET, request = what, reason = %message, "dry-run: would deny");
            (
                Answer {
                    allowed: true,
                    message: None,
                    warnings: vec![format!("groundskeeper dry-run: would deny: {message}")],
                },
                Outcome::DryRun,
            )
        }
        Decision::Deny { message } => {
            tracing::info!(target: LOG_TARGET, request = what, reason = %message, "denying");
            (
                Answer {
                    allowed: false,
                    message: Some(message),
                    warnings: vec![],
                },
                Outcome::Denied,
            )
        }
    }
}

/// The gate webhook's answer for `gating` of pod `what`: the patch to send (None: none), the
/// warnings, and the `result` label. Under `--dry-run` the pod is not gated (a gated pod would
/// wait for a placement that dry-run does not make): allowed unchanged, with a warning.
pub fn gate(
    gating: super::gate::Gating,
    dry_run: bool,
    what: &str,
) -> (Option<serde_json::Value>, Vec<String>, &'static str) {
    use super::gate::Gating;
    use crate::sysctl::facts::GATE;
    match gating {
        Gating::Pass(why) => {
            tracing::debug!(target: LOG_TARGET, pod = what, why, "webhook: not gated");
            (None, vec![], "allowed")
        }
        Gating::AlreadyGated => (None, vec![], "gated"),
        Gating::Gate(_) if dry_run => {
            tracing::info!(target: LOG_TARGET,
                pod = what,
                gate = GATE,
                "dry-run: would add the scheduling gate"
            );
            (
                None,
                vec![format!(
                    "groundskeeper dry-run: would add scheduling gate {GATE} until the pod is placed on a node that admits its sysctls"
                )],
                "dry_run",
            )
        }
        Gating::Gate(patch) => {
            tracing::debug!(target: LOG_TARGET,
                pod = what,
                gate = GATE,
                "webhook: gating a pod that sets sysctls"
            );
            (Some(patch), vec![], "gated")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dry_run_turns_only_a_denial_into_a_warning() {
        let deny = || Decision::Deny {
            message: "forbidden sysctl: x".into(),
        };
        let (a, o) = answer(deny(), false, "binding");
        assert_eq!((a.allowed, o), (false, Outcome::Denied));
        assert_eq!(a.message.as_deref(), Some("forbidden sysctl: x"));
        let (a, o) = answer(deny(), true, "binding");
        assert_eq!((a.allowed, o), (true, Outcome::DryRun));
        assert_eq!(
            a.warnings,
            vec!["groundskeeper dry-run: would deny: forbidden sysctl: x"]
        );
        for dry_run in [false, true] {
            let (a, o) = answer(
                Decision::Audit {
                    message: "m".into(),
                },
                dry_run,
                "b",
            );
            assert_eq!(
                (a.allowed, o, a.warnings.len()),
                (true, Outcome::Audited, 1)
            );
            let (a, o) = answer(Decision::Allow, dry_run, "b");
            assert_eq!(
                (a, o),
                (
                    Answer {
                        allowed: true,
                        ..Default::default()
                    },
                    Outcome::Allowed
                )
            );
        }
    }
}
