//! The certificate worker: loads the Secret's `tls.crt`/`tls.key` into the server whenever it
//! changes, and, when the controller-manager issues its own certificates, takes the rotation
//! steps `rotation::plan` decides and keeps every webhook's caBundle equal to `ca.crt`.
//!
//! Every replica runs it; no leader is needed. Writes are conditional (create fails with 409 if
//! the Secret exists, replace carries the resourceVersion read), so of replicas acting on the
//! same state one wins and the others see its write through their watch and find nothing due.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use groundskeeper_plumbing::{ReadyFlag, watch::cache::Shared};
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;

use super::apply::{ConfigurationKind, Writes, bundle_patch};
use super::cache::{CertCache, Change, Own, SecretFacts};
use super::metrics::Metrics;
use super::rotation::{self, CA_BUNDLE, Step, Stored, TLS_CRT, TLS_KEY, Timing};
use groundskeeper_plumbing::serving::Certificates;

/// The target of this file's log lines, which `RUST_LOG` filters select by: named after
/// the component (`sysctlwebhook`), wherever its code sits.
const LOG_TARGET: &str = "groundskeeper_controllers::sysctlwebhook::certs";

/// Who writes the Secret.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The controller-manager issues a CA and certificate, rotates them, and patches the
    /// caBundles.
    SelfSigned,
    /// Something else (cert-manager) writes `tls.crt`/`tls.key` and the caBundles; the
    /// controller-manager only serves what the Secret holds.
    Secret,
}

pub struct Worker<W> {
    source: Source,
    own: Own,
    hosts: Vec<String>,
    timing: Timing,
    cache: Shared<CertCache>,
    /// The Secret and configuration watches have listed: before that their absence means
    /// nothing.
    listed: Box<dyn Fn() -> bool + Send + Sync>,
    writes: W,
    certs: Arc<Certificates>,
    serving: ReadyFlag,
    metrics: Metrics,
}

impl<W: Writes> Worker<W> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        source: Source,
        own: Own,
        hosts: Vec<String>,
        timing: Timing,
        cache: Shared<CertCache>,
        listed: Box<dyn Fn() -> bool + Send + Sync>,
        writes: W,
        certs: Arc<Certificates>,
        serving: ReadyFlag,
        metrics: Metrics,
    ) -> Self {
        Self {
            source,
            own,
            hosts,
            timing,
            cache,
            listed,
            writes,
            certs,
            serving,
            metrics,
        }
    }

    /// Reconciles on every change of the Secret or a configuration, and every [`TICK`], until
    /// `token` is cancelled.
    pub async fn run(
        self,
        changes: impl futures::Stream<Item = Change>,
        token: tokio_util::sync::CancellationToken,
    ) {
        let mut changes = std::pin::pin!(changes);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = token.cancelled() => break,
                Some(change) = changes.next() => if change == Change::Certificates {
                    self.reconcile().await
                },
                _ = tick.tick() => self.reconcile().await,
            }
        }
    }

    /// Serves what the Secret holds and takes what step is due. Errors are logged; the next
    /// change or tick tries again.
    pub async fn reconcile(&self) {
        if !(self.listed)() {
            return;
        }
        // Each configuration the replica keeps, with its webhooks' bundles when it exists.
        let (secret, configurations) = {
            let c = self.cache.lock();
            let mut configurations = Vec::new();
            if let Some(n) = &self.own.configuration {
                configurations.push((ConfigurationKind::Validating, n, c.webhooks.get(n).cloned()));
            }
            if let Some(n) = &self.own.mutating {
                configurations.push((ConfigurationKind::Mutating, n, c.mutating.get(n).cloned()));
            }
            (c.secret.get(&self.own.secret).cloned(), configurations)
        };
        if let Some(s) = &secret {
            self.serve(s);
        }
        if self.source != Source::SelfSigned {
            return;
        }
        let stored = secret
            .as_ref()
            .map(|s| Stored::read(&s.data, &s.annotations))
            .unwrap_or_default();
        // A configuration that does not exist (yet) calls nobody with an old bundle.
        let trusted = |ca: &str| {
            configurations.iter().all(|(_, _, webhooks)| {
                webhooks.as_ref().is_none_or(|ws| {
                    ws.webhooks
                        .iter()
                        .all(|(_, b)| String::from_utf8_lossy(b).contains(ca.trim_end()))
                })
            })
        };
        let now = Timestamp::now();
        let mut step = rotation::plan(&stored, &self.hosts, now, self.timing, trusted, None);
        if step == Step::CheckValidity {
            // Only when a promotion is due: the staged certificate must be valid by the clock
            // that judges it, the apiserver's.
            let server = match self.writes.apiserver_time().await {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(target: LOG_TARGET, error = %e, "webhook: reading the apiserver's time failed; not promoting the staged certificate yet");
                    return;
                }
            };
            step = rotation::plan(
                &stored,
                &self.hosts,
                now,
                self.timing,
                trusted,
                Some(server),
            );
            if step == Step::NotYetValid {
                tracing::warn!(target: LOG_TARGET, apiserver_time = %server, local_time = %now, "webhook: the staged certificate is not valid yet by the apiserver's clock (this replica's clock is ahead of it by more than the backdating); not promoting it yet");
                return;
            }
        }
        if matches!(
            step,
            Step::Issue | Step::Stage | Step::Promote | Step::MarkTrusted | Step::Untrusted
        ) {
            let fresh = match step {
                Step::Issue | Step::Stage => {
                    match rotation::issue(&self.hosts, now, self.timing.validity) {
                        Ok(g) => Some(g),
                        Err(e) => {
                            tracing::error!(target: LOG_TARGET, error = %e, "webhook: issuing a certificate failed; will retry");
                            return;
                        }
                    }
                }
                _ => None,
            };
            let next = rotation::apply(&stored, &step, now, fresh);
            self.write(secret.as_ref(), &step, &next).await;
            return;
        }
        for (kind, name, webhooks) in &configurations {
            if let (Some(ws), Some(s)) = (webhooks, &secret)
                && let Some(bundle) = s.data.get(CA_BUNDLE)
                && let Some(patch) = bundle_patch(ws, bundle)
            {
                // The Secret may have moved on since this replica's watch saw it (a renewal
                // staged or promoted by another): its old bundle must not be written back. The
                // configuration's side is the patch's resourceVersion.
                match self.writes.live_bundle(&self.own.secret).await {
                    Ok(Some(live)) if live == *bundle => {}
                    Ok(_) => {
                        tracing::debug!(target: LOG_TARGET, configuration = %name, "webhook: the Secret changed since it was read; waiting for its event before patching the caBundles");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(target: LOG_TARGET, secret = %self.own.secret, error = %e, "webhook: reading the Secret before patching the caBundles failed; will retry");
                        return;
                    }
                }
                self.patch_bundles(*kind, name, &patch).await;
            }
        }
    }

    async fn patch_bundles(&self, kind: ConfigurationKind, name: &str, patch: &serde_json::Value) {
        let resource = kind.resource();
        match self.writes.patch_configuration(kind, name, patch).await {
            Ok(()) => {
                tracing::info!(target: LOG_TARGET, configuration = %name, resource, "webhook: caBundles set to the Secret's ca.crt");
                self.metrics
                    .certificate_steps
                    .with_label_values(&["ca_bundle"])
                    .inc();
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(target: LOG_TARGET, configuration = %name, resource, "webhook: the configuration changed since it was read; its event brings the next try")
            }
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, configuration = %name, resource, error = %e, "webhook: patching the caBundles failed; will retry")
            }
        }
    }

    /// Loads the Secret's certificate when it changed.
    fn serve(&self, s: &SecretFacts) {
        let (Some(cert), Some(key)) = (s.data.get(TLS_CRT), s.data.get(TLS_KEY)) else {
            return;
        };
        match self.certs.load(cert, key) {
            Ok(false) => {}
            Ok(true) => {
                let expiry = s
                    .annotations
                    .get(rotation::TLS_NOT_AFTER)
                    .and_then(|t| t.parse::<Timestamp>().ok());
                tracing::info!(target: LOG_TARGET, secret = %self.own.secret, not_after = %expiry.map_or_else(|| "unknown".to_string(), |t| t.to_string()), "webhook: serving certificate loaded");
                if let Some(t) = expiry {
                    self.metrics.certificate_expiry.set(t.as_second());
                }
                self.serving.mark_ready();
            }
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, secret = %self.own.secret, error = %e, "webhook: the Secret's certificate can not be served; keeping the one loaded")
            }
        }
    }

    async fn write(&self, current: Option<&SecretFacts>, step: &Step, stored: &Stored) {
        let (data, annotations) = stored.write();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.own.secret.clone()),
                namespace: Some(self.own.namespace.clone()),
                annotations: Some(annotations),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_string(),
                        "groundskeeper-controller-manager".to_string(),
                    )]
                    .into(),
                ),
                resource_version: current.map(|s| s.resource_version.clone()),
                ..Default::default()
            },
            data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        let written = match current {
            None => self.writes.create_secret(&secret).await,
            Some(_) => self.writes.replace_secret(&secret).await,
        };
        let label = match step {
            Step::Issue => "issue",
            Step::Stage => "stage",
            Step::MarkTrusted => "trusted",
            Step::Untrusted => "untrusted",
            _ => "promote",
        };
        match written {
            Ok(()) => {
                tracing::info!(target: LOG_TARGET, secret = %self.own.secret, step = label, hosts = %groundskeeper_plumbing::logging::telemetry::joined(&self.hosts), "webhook: certificate Secret written");
                self.metrics
                    .certificate_steps
                    .with_label_values(&[label])
                    .inc();
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(target: LOG_TARGET,
                    step = label,
                    "webhook: another replica wrote the Secret first"
                );
            }
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, secret = %self.own.secret, step = label, error = %e, "webhook: writing the certificate Secret failed; will retry")
            }
        }
    }
}

/// How often the task looks again without a change: renewals come due by the clock.
pub const TICK: Duration = Duration::from_secs(5);
