//! The sysctl admission webhook's flags and `run`: keeps a pod off a node whose sysctl policy
//! forbids it, before kubelet ever sees it.
//!
//! Served by every controller-manager replica, leader or not, on `pods/binding` CREATE (the
//! scheduler binding a pod) and pod CREATE with `spec.nodeName`. A denied binding leaves the
//! pod Pending; the scheduler retries it with backoff. The same listener serves the mutating
//! gate (`gate.rs`, `mutate.rs`) that holds a pod setting sysctls until the placement controller
//! (`sysctl::placement`) has narrowed it to the nodes that admit it. The verdict is the shared one the
//! node-agent reports by (`groundskeeper_sysctl_rules`). TLS comes from a Secret, written by the
//! controller-manager itself or by cert-manager (`sysctl::tls`).

pub mod apply;
pub mod decide;
pub mod gate;
pub mod limits;
pub mod metrics;
pub mod mutate;
pub mod review;
pub mod serve;
#[cfg(test)]
mod server_tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use groundskeeper_plumbing::{
    client::{parse_duration, parse_qps, ratelimit::Budget},
    life::component::{Crew, Life},
    watch::cache::Shared,
};
use groundskeeper_sysctl_rules::args::PolicyArgs;

use super::cache::Watched;
use super::tls::{self, apply::KubeWrites, cache::Own, rotation::Timing, worker::Source};
use crate::context::Context;
use groundskeeper_plumbing::serving::{self, Certificates};
use metrics::Metrics;
use serve::{Lookups, Reviewer};

/// The target of this file's log lines, which `RUST_LOG` filters select by: named after
/// the component (`sysctlwebhook`), wherever its code sits.
const LOG_TARGET: &str = "groundskeeper_controllers::sysctlwebhook";

/// Readiness flags of the webhook's own watches and of its certificate are
/// `sysctlwebhook/<kind>`; what it judges on is the wing's (`sysctl/<kind>`).
pub const COMPONENT: &str = "sysctlwebhook";

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Sysctl admission webhook")]
pub struct WebhookArgs {
    /// Serve the sysctl admission webhook (every replica, not only the leader). The chart's
    /// ValidatingWebhookConfiguration sends it pod bindings and pods created on a node.
    #[arg(long = "sysctl-webhook", env = "GROUNDSKEEPER_SYSCTL_WEBHOOK", default_value_t = false,
          action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enabled: bool,

    /// Where the webhook serves HTTPS.
    #[arg(
        long,
        env = "GROUNDSKEEPER_WEBHOOK_ADDR",
        default_value = "0.0.0.0:9443"
    )]
    pub webhook_addr: SocketAddr,

    /// Who writes the TLS Secret: `self-signed` (the controller-manager issues and rotates a
    /// CA and certificate, and patches the caBundles of --webhook-configuration) or `secret`
    /// (cert-manager or an admin writes tls.crt/tls.key and the caBundles; it is only served).
    #[arg(
        long,
        env = "GROUNDSKEEPER_WEBHOOK_CERTIFICATES",
        value_enum,
        default_value = "self-signed"
    )]
    pub webhook_certificates: Source,

    /// The Secret holding the certificate, in --webhook-namespace.
    #[arg(
        long,
        env = "GROUNDSKEEPER_WEBHOOK_TLS_SECRET",
        default_value = "groundskeeper-webhook-tls"
    )]
    pub webhook_tls_secret: String,

    /// The namespace of the TLS Secret (the pod's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub webhook_namespace: String,

    /// The ValidatingWebhookConfiguration whose webhooks' caBundles are kept equal to the
    /// Secret's ca.crt (self-signed only).
    #[arg(long, env = "GROUNDSKEEPER_WEBHOOK_CONFIGURATION")]
    pub webhook_configuration: Option<String>,

    /// The MutatingWebhookConfiguration (the sysctl scheduling gate) whose caBundles are kept
    /// equal to the Secret's ca.crt too (self-signed only).
    #[arg(long, env = "GROUNDSKEEPER_WEBHOOK_MUTATING_CONFIGURATION")]
    pub webhook_mutating_configuration: Option<String>,

    /// Comma-separated DNS names and IP addresses the self-signed certificate is for: the
    /// Service's name the apiserver calls (`<service>.<namespace>.svc`).
    #[arg(long, env = "GROUNDSKEEPER_WEBHOOK_CERT_HOSTS", value_delimiter = ',')]
    pub webhook_cert_hosts: Vec<String>,

    /// Lifetime of a self-signed generation (CA and certificate); renewal is staged with a
    /// third of it left.
    #[arg(long, env = "GROUNDSKEEPER_WEBHOOK_CERT_VALIDITY", default_value = "2160h", value_parser = parse_duration)]
    pub webhook_cert_validity: Duration,

    /// Pod reads per second the webhook may make (a binding whose pod its watch has not
    /// delivered yet), on a client of their own, apart from --kube-api-qps. Past it, such a
    /// binding is judged without the pod: allowed where the node can not enforce, denied (and
    /// retried by the scheduler) where it can. <= 0: unlimited.
    #[arg(long, env = "GROUNDSKEEPER_WEBHOOK_LOOKUP_QPS", default_value_t = 5.0, value_parser = parse_qps)]
    pub webhook_lookup_qps: f32,

    /// Pod reads allowed in a burst above --webhook-lookup-qps.
    #[arg(long, env = "GROUNDSKEEPER_WEBHOOK_LOOKUP_BURST", default_value_t = 10)]
    pub webhook_lookup_burst: u32,

    /// How long a renewed CA is in the caBundles before its certificate is served (for the
    /// apiserver to load the new bundle). Hidden: for tests of rotation.
    #[arg(long, env = "GROUNDSKEEPER_WEBHOOK_CERT_GRACE", default_value = "30s", value_parser = parse_duration, hide = true)]
    pub webhook_cert_grace: Duration,
}

impl WebhookArgs {
    /// The flags that only make sense together, named when they do not.
    pub fn validate(&self) -> Result<(), String> {
        if !self.enabled || self.webhook_certificates != Source::SelfSigned {
            return Ok(());
        }
        if self.hosts().is_empty() {
            return Err(
                "--webhook-cert-hosts must name the webhook Service's DNS name with --webhook-certificates=self-signed"
                    .into(),
            );
        }
        if self.webhook_cert_validity < Duration::from_secs(60) {
            return Err(format!(
                "--webhook-cert-validity {:?} is too short (at least 1m)",
                self.webhook_cert_validity
            ));
        }
        Ok(())
    }

    fn hosts(&self) -> Vec<String> {
        self.webhook_cert_hosts
            .iter()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect()
    }
}

/// Serves the webhook until the context's token is cancelled, judging on the process's sysctl
/// watches (`watched`); `lookups` is the client of its pod reads (see [`Lookups`]).
pub async fn run(
    ctx: Context,
    args: WebhookArgs,
    policy: PolicyArgs,
    lookups: kube::Client,
    watched: Watched,
) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    let base = &ctx.base;
    let metrics = Metrics::register(&base.registry)?;
    let tls_metrics = tls::metrics::Metrics::register(&base.registry)?;
    let certificates = Shared::default();
    let self_signed = args.webhook_certificates == Source::SelfSigned;
    let own = Own {
        namespace: args.webhook_namespace.clone(),
        secret: args.webhook_tls_secret.clone(),
        configuration: args.webhook_configuration.clone().filter(|_| self_signed),
        mutating: args
            .webhook_mutating_configuration
            .clone()
            .filter(|_| self_signed),
    };
    let (own_flags, changes) = tls::cache::follow_all(
        &base.readiness,
        COMPONENT,
        &base.client,
        &own,
        &certificates,
    );
    // Its requests wait for every watch, the wing's and its own: 503 until all have listed.
    let health = watched.health_with(own_flags);
    let serving = base.readiness.register(format!("{COMPONENT}/certificate"));
    let certs = Arc::new(Certificates::default());
    let limits = limits::limits();
    let reviewer = Arc::new(Reviewer {
        args: policy.clone(),
        dry_run: base.dry_run,
        cache: watched.cache.clone(),
        health: health.clone(),
        lookups: Lookups {
            client: lookups,
            budget: Budget::new(args.webhook_lookup_qps, args.webhook_lookup_burst),
        },
        metrics: metrics.clone(),
    });
    let router = serving::limited(
        serve::router(reviewer.clone()).merge(mutate::router(reviewer)),
        &limits,
        metrics.counters(),
    );
    let (addr, serve) = serving::bind(
        args.webhook_addr,
        "--webhook-addr",
        Some(serving::server_config(certs.clone())?),
        router,
        limits,
        metrics.counters(),
        base.token.clone(),
    )
    .await?;
    tracing::info!(target: LOG_TARGET, %addr, certificates = ?args.webhook_certificates, secret = %own.secret, allowed_unsafe = %groundskeeper_plumbing::logging::telemetry::joined(policy.allowed_unsafe_sysctls()), default_mode = %policy.sysctl_default_mode, "sysctl webhook serving");
    let listed = health.clone();
    let worker = tls::worker::Worker::new(
        args.webhook_certificates,
        own.clone(),
        args.hosts(),
        Timing {
            validity: args.webhook_cert_validity,
            grace: args.webhook_cert_grace,
        },
        certificates,
        Box::new(move || listed.listed()),
        KubeWrites::new(base.client.clone(), own.namespace.clone()),
        certs,
        serving,
        tls_metrics,
    );

    // Every replica serves, leader or not: no gate. The server and the certificate worker end
    // on the token; either ending earlier fails the webhook.
    Life::new(COMPONENT, base.token.clone())
        .run(async {}, || {
            Crew::default()
                .task(serve)
                .task(worker.run(changes, base.token.clone()))
        })
        .await?;
    tracing::info!(target: LOG_TARGET, "sysctl webhook stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_default_and_refusals_name_the_flag() {
        let parse = testkit::cli::args::<WebhookArgs>;
        let a = parse(&[]).unwrap();
        assert!(!a.enabled);
        assert_eq!(a.webhook_addr.to_string(), "0.0.0.0:9443");
        assert_eq!(a.webhook_certificates, Source::SelfSigned);
        assert_eq!(a.webhook_cert_validity, Duration::from_secs(90 * 86_400));
        assert!(a.validate().is_ok(), "off: nothing to check");

        let a = parse(&["--sysctl-webhook"]).unwrap();
        let e = a.validate().unwrap_err();
        assert!(e.contains("--webhook-cert-hosts"), "{e}");
        let a = parse(&["--sysctl-webhook", "--webhook-certificates=secret"]).unwrap();
        assert!(a.validate().is_ok(), "cert-manager names the hosts");
        let a = parse(&[
            "--sysctl-webhook=true",
            "--webhook-cert-hosts",
            "gk-webhook.gk.svc, 127.0.0.1,",
            "--webhook-cert-validity=30s",
        ])
        .unwrap();
        assert_eq!(a.hosts(), vec!["gk-webhook.gk.svc", "127.0.0.1"]);
        assert!(
            a.validate()
                .unwrap_err()
                .contains("--webhook-cert-validity")
        );
        let e = parse(&["--webhook-certificates=vault"]).unwrap_err();
        assert!(e.contains("vault"), "{e}");
    }
}
