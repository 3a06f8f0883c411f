//! The certificate task's writes, the Secret and the caBundles, behind [`Writes`].
//!
//! They are made under `--dry-run` too: they change no workload, and without them no request
//! could reach the webhook to be dry-run.

use std::future::Future;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use super::cache::WebhookBundles;

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
}
