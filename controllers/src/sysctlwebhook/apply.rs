//! What the webhook carries out: its answers (the one place `--dry-run` turns a denial into a
//! warning) and its writes, the certificate Secret and the caBundles, behind [`Writes`].
//!
//! The certificate writes are made under `--dry-run` too: they change no workload, and without
//! them no request could reach the webhook to be dry-run.

use std::future::Future;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use super::cache::WebhookBundles;
use super::decide::Decision;
use super::review::Answer;

/// The API writes of the certificate task, nothing decided here.
pub trait Writes: Send + Sync {
    /// Creates the Secret; an existing one is the apiserver's 409.
    fn create_secret(
        &self,
        secret: &Secret,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Replaces the Secret; its `metadata.resourceVersion` is the precondition (409 when
    /// another replica wrote first).
    fn replace_secret(
        &self,
        secret: &Secret,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// Applies a JSON patch (see [`bundle_patch`]) to the webhook configuration of `kind`.
    fn patch_configuration(
        &self,
        kind: ConfigurationKind,
        name: &str,
        patch: &serde_json::Value,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
    /// The Secret's `ca.crt` as the apiserver holds it now (a live list by name), `None`
    /// without one.
    fn live_bundle(
        &self,
        secret: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, kube::Error>> + Send;
    /// The apiserver's clock: the `Date` header of its answer to `GET /version` (whole
    /// seconds, so at most a second behind it: never ahead).
    fn apiserver_time(&self) -> impl Future<Output = Result<Timestamp, kube::Error>> + Send;
}

/// The time an HTTP `Date` header says (RFC 9110's IMF-fixdate, `Sun, 06 Nov 1994 08:49:37
/// GMT`, which RFC 2822 reads).
pub fn http_date(value: &str) -> Option<Timestamp> {
    jiff::fmt::rfc2822::parse(value).ok().map(|z| z.timestamp())
}

/// The webhook configurations whose caBundles the controller-manager keeps: the validating
/// one (bindings, pods created on a node) and the mutating one (the scheduling gate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigurationKind {
    Validating,
    Mutating,
}

impl ConfigurationKind {
    pub fn resource(self) -> &'static str {
        match self {
            ConfigurationKind::Validating => "validatingwebhookconfigurations",
            ConfigurationKind::Mutating => "mutatingwebhookconfigurations",
        }
    }
}

pub struct KubeWrites {
    client: kube::Client,
    namespace: String,
}

impl KubeWrites {
    pub fn new(client: kube::Client, namespace: String) -> Self {
        Self { client, namespace }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

impl Writes for KubeWrites {
    async fn apiserver_time(&self) -> Result<Timestamp, kube::Error> {
        let request = http::Request::get("/version")
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        let answer = self.client.send(request.map(Into::into)).await?;
        answer
            .headers()
            .get(http::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(http_date)
            .ok_or_else(|| {
                kube::Error::Service(
                    "the apiserver's answer carries no readable Date header".into(),
                )
            })
    }

    async fn create_secret(&self, secret: &Secret) -> Result<(), kube::Error> {
        self.secrets()
            .create(&PostParams::default(), secret)
            .await
            .map(|_| ())
    }

    async fn replace_secret(&self, secret: &Secret) -> Result<(), kube::Error> {
        let name = secret.metadata.name.as_deref().unwrap_or_default();
        self.secrets()
            .replace(name, &PostParams::default(), secret)
            .await
            .map(|_| ())
    }

    async fn live_bundle(&self, secret: &str) -> Result<Option<Vec<u8>>, kube::Error> {
        // A list by name, not a GET: the Role grants list and watch of this one Secret only.
        let by_name = ListParams::default().fields(&format!("metadata.name={secret}"));
        let list = self.secrets().list(&by_name).await?;
        Ok(list
            .items
            .into_iter()
            .next()
            .and_then(|s| s.data?.remove(super::rotation::CA_BUNDLE))
            .map(|b| b.0))
    }

    async fn patch_configuration(
        &self,
        kind: ConfigurationKind,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        // kube's typed JSON patch needs the json-patch crate; the body is plain JSON anyway.
        let url = format!(
            "/apis/admissionregistration.k8s.io/v1/{}/{name}",
            kind.resource()
        );
        let req = http::Request::patch(url)
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(serde_json::to_vec(patch).map_err(kube::Error::SerdeError)?)
            .map_err(kube::Error::HttpError)?;
        // Either kind: only the status of the answer matters.
        self.client
            .request::<serde_json::Value>(req)
            .await
            .map(|_| ())
    }
}

/// The JSON patch that sets every webhook's caBundle to `bundle`, each guarded by a test of
/// the webhook's name at its index (a configuration reordered meanwhile fails the patch instead
/// of getting a bundle in the wrong place); None when every one already holds it. The
/// resourceVersion the configuration was read at goes in too, as the precondition of the
/// update (409 when it changed since): a replica whose view is behind never writes over a
/// newer bundle.
pub fn bundle_patch(webhooks: &WebhookBundles, bundle: &[u8]) -> Option<serde_json::Value> {
    let mut ops = Vec::new();
    for (i, (name, ca)) in webhooks.webhooks.iter().enumerate() {
        if ca.as_slice() == bundle {
            continue;
        }
        ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": name}));
        ops.push(json!({
            "op": "add",
            "path": format!("/webhooks/{i}/clientConfig/caBundle"),
            "value": ByteString(bundle.to_vec()),
        }));
    }
    if ops.is_empty() {
        return None;
    }
    if !webhooks.resource_version.is_empty() {
        ops.push(json!({
            "op": "replace",
            "path": "/metadata/resourceVersion",
            "value": webhooks.resource_version,
        }));
    }
    Some(serde_json::Value::Array(ops))
}

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
            tracing::info!(request = what, reason = %message, "allowing forbidden sysctls (audit mode)");
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
            tracing::info!(request = what, reason = %message, "dry-run: would deny");
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
            tracing::info!(request = what, reason = %message, "denying");
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
    use super::gate::{GATE, Gating};
    match gating {
        Gating::Pass(why) => {
            tracing::debug!(pod = what, why, "webhook: not gated");
            (None, vec![], "allowed")
        }
        Gating::AlreadyGated => (None, vec![], "gated"),
        Gating::Gate(_) if dry_run => {
            tracing::info!(
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
            tracing::debug!(
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
    fn only_stale_bundles_are_patched_each_behind_a_name_test() {
        let all = vec![
            (
                "binding.sysctl.groundskeeper.dev".to_string(),
                b"old".to_vec(),
            ),
            ("pod.sysctl.groundskeeper.dev".to_string(), b"new".to_vec()),
        ];
        let read_at = |webhooks: &[(String, Vec<u8>)]| WebhookBundles {
            resource_version: "42".into(),
            webhooks: webhooks.to_vec(),
        };
        let patch = bundle_patch(&read_at(&all), b"new").unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/webhooks/0/name", "value": "binding.sysctl.groundskeeper.dev"},
                {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "bmV3"},
                {"op": "replace", "path": "/metadata/resourceVersion", "value": "42"},
            ])
        );
        assert_eq!(bundle_patch(&read_at(&all[1..]), b"new"), None);
        assert_eq!(bundle_patch(&read_at(&[]), b"new"), None);
    }

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
