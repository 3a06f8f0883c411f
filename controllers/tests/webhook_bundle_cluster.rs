//! The caBundle patch against a real apiserver: it carries the resourceVersion the
//! configuration was read at, so a replica whose view is behind never writes an old bundle
//! over a newer one.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};

use groundskeeper_controllers::sysctl::tls::{
    apply::{ConfigurationKind, KubeWrites, Writes, bundle_patch},
    cache::WebhookBundles,
};
use testkit::unique_name;

fn bundles(c: &ValidatingWebhookConfiguration) -> WebhookBundles {
    WebhookBundles {
        resource_version: c.metadata.resource_version.clone().unwrap_or_default(),
        webhooks: c
            .webhooks
            .iter()
            .flatten()
            .map(|w| {
                let ca = w.client_config.ca_bundle.clone().map(|b| b.0);
                (w.name.clone(), ca.unwrap_or_default())
            })
            .collect(),
    }
}

fn ca_bundle(c: &ValidatingWebhookConfiguration) -> Vec<u8> {
    bundles(c).webhooks[0].1.clone()
}

#[tokio::test]
async fn a_bundle_patch_from_a_stale_view_is_refused() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("a_bundle_patch_from_a_stale_view_is_refused").await else {
        return Ok(());
    };
    let name = unique_name("gk-bundle");
    let api = Api::<ValidatingWebhookConfiguration>::all(c.client.clone());
    let webhook = |ca: &[u8]| ValidatingWebhook {
        name: "binding.sysctl.groundskeeper.dev".into(),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        failure_policy: Some("Ignore".into()),
        client_config: WebhookClientConfig {
            url: Some("https://127.0.0.1:9/validate".into()),
            ca_bundle: Some(ByteString(ca.to_vec())),
            ..Default::default()
        },
        // Selects nothing: no request is ever sent to it.
        namespace_selector: Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([("gk-bundle-test".to_string(), name.clone())].into()),
                ..Default::default()
            },
        ),
        ..Default::default()
    };
    let created = api
        .create(
            &PostParams::default(),
            &ValidatingWebhookConfiguration {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                webhooks: Some(vec![webhook(b"old")]),
            },
        )
        .await?;
    let stale = bundles(&created);
    // Another replica, current, writes the new bundle.
    let writes = KubeWrites::new(c.client.clone(), "default".into());
    let fresh_patch = bundle_patch(&stale, b"new").expect("old differs from new");
    writes
        .patch_configuration(ConfigurationKind::Validating, &name, &fresh_patch)
        .await?;
    let now = api.get(&name).await?;
    assert_eq!(ca_bundle(&now), b"new");

    // This replica still sees the first version and would put another bundle in.
    let stale_patch = bundle_patch(&stale, b"older").expect("old differs from older");
    match writes
        .patch_configuration(ConfigurationKind::Validating, &name, &stale_patch)
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        other => anyhow::bail!("a patch from a stale view must be refused with 409: {other:?}"),
    }
    assert_eq!(
        ca_bundle(&api.get(&name).await?),
        b"new",
        "the newer bundle stays"
    );

    // From the current view the same patch goes through.
    let current_patch = bundle_patch(&bundles(&now), b"older").expect("differs");
    writes
        .patch_configuration(ConfigurationKind::Validating, &name, &current_patch)
        .await?;
    assert_eq!(ca_bundle(&api.get(&name).await?), b"older");

    api.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}
