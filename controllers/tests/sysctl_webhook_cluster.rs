//! The sysctl admission webhook against a real apiserver: the chart's own
//! ValidatingWebhookConfiguration, with its clientConfig pointed at a controller-manager on
//! 127.0.0.1 (the controller-manager issues the CA and patches the caBundle itself), and
//! narrowed to the test's namespace. Pods are bound through `pods/binding` as the scheduler
//! binds them, or created with `spec.nodeName`; every row of the shared sysctl table
//! (`groundskeeper_sysctl_rules::cases`) is a Node, its SysctlPolicies and a pod, and the apiserver's
//! answer must be what the row says.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use groundskeeper_sysctl_rules::cases::{self, Case, Want};
use groundskeeper_sysctl_rules::crd::{Mode, SysctlPolicy, SysctlPolicySpec, crd_yaml};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use testkit::{Binary, Cluster, free_addr, http_get, unique_name, wait_for, wait_ready, webhook};

const WAIT: Duration = Duration::from_secs(30);
/// Every object of one test carries this label with the test's own value, so the policies of
/// one test (and of other tests sharing the apiserver) never select another's nodes.
const RUN_LABEL: &str = "groundskeeper.dev/sysctl-webhook-test";

struct Webhook {
    bin: Binary,
    admin: SocketAddr,
    addr: SocketAddr,
    config: String,
    secret: String,
    ns: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// Starts a controller-manager serving only the webhook on a free port, registers the chart's
/// configuration for it, and waits until the apiserver calls it. None without helm.
async fn webhook(
    c: &Cluster,
    test: &str,
    default_mode: &str,
    failure_policy: &str,
    extra: &[&str],
) -> anyhow::Result<Option<Webhook>> {
    let ns = c.namespace_for_pods("gk-webhook", WAIT).await?;
    let names = (unique_name("gk-sysctl-test"), unique_name("gk-webhook-tls"));
    let mut args = vec![format!("--sysctl-default-mode={default_mode}")];
    args.extend(extra.iter().map(|s| s.to_string()));
    webhook_in(c, test, &ns, names, failure_policy, args, None).await
}

/// [`webhook`] in namespace `ns`, with the configuration and Secret named `names`, acting as
/// `kubeconfig` (the tests' own when None).
async fn webhook_in(
    c: &Cluster,
    test: &str,
    ns: &str,
    (config, secret): (String, String),
    failure_policy: &str,
    extra: Vec<String>,
    kubeconfig: Option<String>,
) -> anyhow::Result<Option<Webhook>> {
    c.ensure_crd(&crd_yaml()).await?;
    let addr = free_addr();
    let Some(vwc) = webhook::chart_configuration(&config, addr, ns, failure_policy) else {
        testkit::skipped(test, "helm not installed (run .ci/tools.sh)");
        return Ok(None);
    };
    c.create(&vwc).await?;
    let mut args: Vec<String> = [
        "--leader-elect=false",
        "--controllers=",
        "--sysctl-webhook",
        &format!("--webhook-addr={addr}"),
        "--webhook-cert-hosts=127.0.0.1",
        &format!("--webhook-configuration={config}"),
        &format!("--webhook-tls-secret={secret}"),
        &format!("--allowed-unsafe-sysctls={}", cases::FLAG.join(",")),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra);
    let mut env = vec![("POD_NAMESPACE".to_string(), ns.to_string())];
    if let Some(k) = kubeconfig {
        env.push(("KUBECONFIG".into(), k));
    }
    let (bin, admin) = start(&args, &env)?;
    let w = Webhook {
        bin,
        admin,
        addr,
        config,
        secret,
        ns: ns.to_string(),
        args,
        env,
    };
    w.wait_called(c).await?;
    Ok(Some(w))
}

fn start(args: &[String], env: &[(String, String)]) -> anyhow::Result<(Binary, SocketAddr)> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-webhook",
        &args,
        &env,
    )
}

impl Webhook {
    /// Ready, caBundle patched, and the apiserver reaching it over TLS: a dry-run create of a
    /// pod the webhook sees (a sysctl outside the safe ones every node allows, which no webhook
    /// is sent) is counted in its metrics.
    async fn wait_called(&self, c: &Cluster) -> anyhow::Result<()> {
        wait_ready(self.admin, WAIT, "controller-manager /readyz")
            .await
            .map_err(|e| anyhow::anyhow!("{e}\nlog:\n{}", self.bin.logs()))?;
        let probe = bound_pod(&self.ns, "probe", "gk-probe-node", &["net.core.somaxconn"]);
        let pods = Api::<Pod>::namespaced(c.client.clone(), &self.ns);
        wait_for(WAIT, "the apiserver to call the webhook", || async {
            let _ = pods
                .create(
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &probe,
                )
                .await;
            Ok(self.reviews("pod", None).await? > 0.0)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlog:\n{}", self.bin.logs()))?;
        Ok(())
    }

    /// The webhook's review count for `subject`, of `result` (all results when None).
    async fn reviews(&self, subject: &str, result: Option<&str>) -> anyhow::Result<f64> {
        let (_, body) = http_get(self.admin, "/metrics").await?;
        Ok(body
            .lines()
            .filter(|l| l.starts_with("groundskeeper_sysctl_admission_reviews_total{"))
            .filter(|l| l.contains(&format!("subject=\"{subject}\"")))
            .filter(|l| result.is_none_or(|r| l.contains(&format!("result=\"{r}\""))))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

fn bound_pod(ns: &str, prefix: &str, node: &str, sysctls: &[&str]) -> Pod {
    let mut pod = testkit::bound_pod(ns, &unique_name(prefix), node);
    pod.spec.as_mut().expect("a spec").security_context = Some(testkit::sysctls(sysctls));
    pod
}

fn unbound_pod(ns: &str, prefix: &str, sysctls: &[&str]) -> Pod {
    let mut pod = bound_pod(ns, prefix, "", sysctls);
    pod.spec.as_mut().expect("a spec").node_name = None;
    pod
}

/// The rows' Nodes and SysctlPolicies, labelled `run`, each row's policies selecting only its
/// node; then a barrier Node and Enforce policy, created last, that the webhook must have seen
/// before any row is asked (each watch delivers in order, so then it has every row's objects).
async fn scene(
    c: &Cluster,
    w: &Webhook,
    run: &str,
    rows: &[(usize, Case)],
) -> anyhow::Result<Vec<String>> {
    let mut nodes = Vec::new();
    for (i, case) in rows {
        let id = format!("{run}-{i}");
        let mut labels = case.labels();
        labels.insert(RUN_LABEL.into(), id.clone());
        let node = unique_name(&format!("gk-case-{i}"));
        c.create(&webhook::node(&node, labels, case.kernel)).await?;
        for mut p in case.policies() {
            // Same prefix for all of a row's policies: their order (and the message) is kept.
            p.metadata.name = Some(format!("{id}-{}", p.name_any()));
            let sel = p
                .spec
                .node_selector
                .get_or_insert_with(LabelSelector::default);
            sel.match_labels
                .get_or_insert_with(BTreeMap::new)
                .insert(RUN_LABEL.into(), id.clone());
            c.create(&p).await?;
        }
        nodes.push(node);
    }
    let barrier_id = format!("{run}-barrier");
    let barrier = unique_name("gk-barrier");
    c.create(&webhook::node(
        &barrier,
        [(RUN_LABEL.to_string(), barrier_id.clone())].into(),
        Some("6.1.0"),
    ))
    .await?;
    let policy = c
        .create(&SysctlPolicy::new(
            &format!("{barrier_id}-policy"),
            SysctlPolicySpec {
                allowed_unsafe_sysctls: vec![],
                node_selector: Some(LabelSelector {
                    match_labels: Some([(RUN_LABEL.to_string(), barrier_id)].into()),
                    ..Default::default()
                }),
                mode: Mode::Enforce,
            },
        ))
        .await?;
    let probe = bound_pod(&w.ns, "barrier", &barrier, &["kernel.msgmax"]);
    let pods = Api::<Pod>::namespaced(c.client.clone(), &w.ns);
    let want = format!("SysctlPolicy {}", policy.name_any());
    wait_for(
        WAIT,
        "the webhook to see every row's node and policies",
        || async {
            match pods
                .create(
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &probe,
                )
                .await
            {
                Err(kube::Error::Api(e)) => Ok(e.message.contains(&want)),
                _ => Ok(false),
            }
        },
    )
    .await?;
    Ok(nodes)
}

/// Every row of the table with this default mode: a binding and a creation on the row's node.
async fn table(test: &str, mode: Mode) -> anyhow::Result<()> {
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let flag = mode.to_string().to_lowercase();
    let Some(w) = webhook(&c, test, &flag, "Fail", &[]).await? else {
        return Ok(());
    };
    let rows: Vec<(usize, Case)> = cases::cases()
        .into_iter()
        .enumerate()
        .filter(|(_, c)| c.default_mode == mode && !c.apiserver_refuses())
        .collect();
    assert!(rows.len() >= 5, "{} rows for {mode}", rows.len());
    let run = unique_name("run");
    let nodes = scene(&c, &w, &run, &rows).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &w.ns);

    // All pods first, then the bindings: the later ones are in the webhook's cache of pods not
    // yet bound, the first may not be (judged from a GET then).
    let mut created = Vec::new();
    for (i, case) in &rows {
        created.push(
            c.create(&unbound_pod(&w.ns, &format!("row-{i}"), case.sysctls))
                .await?,
        );
    }
    for (((_, case), node), pod) in rows.iter().zip(&nodes).zip(&created) {
        let bound = webhook::bind(&c.client, &w.ns, pod, node).await;
        let after = pods.get(&pod.name_any()).await?;
        let on = after.spec.as_ref().and_then(|s| s.node_name.clone());
        check(case, "binding", "binding.sysctl.groundskeeper.dev", bound);
        match case.want {
            Want::Forbidden(Mode::Enforce, _) => {
                assert_eq!(
                    on, None,
                    "{}: a denied binding leaves the pod unbound",
                    case.name
                );
                let phase = after.status.and_then(|s| s.phase);
                assert_eq!(phase.as_deref(), Some("Pending"), "{}", case.name);
            }
            _ => assert_eq!(on.as_deref(), Some(node.as_str()), "{}", case.name),
        }
        let created = c
            .create(&bound_pod(&w.ns, "created", node, case.sysctls))
            .await
            .map(|_| ());
        let created = created.map_err(|e| match e.downcast::<kube::Error>() {
            Ok(k) => k,
            Err(e) => panic!("{}: {e}", case.name),
        });
        check(case, "creation", "pod.sysctl.groundskeeper.dev", created);
    }
    let denied = rows
        .iter()
        .filter(|(_, c)| matches!(c.want, Want::Forbidden(Mode::Enforce, _)))
        .count() as f64;
    assert_eq!(w.reviews("binding", Some("denied")).await?, denied);
    w.bin.assert_no_api_refusals();
    // SIGTERM: the webhook drains and the process exits 0.
    let mut bin = w.bin;
    bin.signal("TERM").await?;
    assert_eq!(bin.wait_exit(WAIT).await?, Some(0), "{}", bin.logs());
    Ok(())
}

/// Denied with the row's message by `webhook` when the row says Enforce; allowed otherwise.
fn check(case: &Case, what: &str, webhook: &str, result: Result<(), kube::Error>) {
    match (case.want, result) {
        (Want::Forbidden(Mode::Enforce, m), Err(kube::Error::Api(e))) => {
            assert!(
                e.message.contains(&format!(
                    "admission webhook \"{webhook}\" denied the request"
                )) && e.message.contains(m),
                "{}: {what} refused for another reason: {}",
                case.name,
                e.message
            );
            assert_eq!(e.code, 403, "{}: {what}", case.name);
        }
        (Want::Forbidden(Mode::Enforce, _), Ok(())) => {
            panic!("{}: {what} allowed, the table says Enforce", case.name)
        }
        (_, Ok(())) => {}
        (_, Err(e)) => panic!("{}: {what} refused: {e}", case.name),
    }
}

#[tokio::test]
async fn the_table_under_default_audit() -> anyhow::Result<()> {
    table("the_table_under_default_audit", Mode::Audit).await
}

#[tokio::test]
async fn the_table_under_default_enforce() -> anyhow::Result<()> {
    table("the_table_under_default_enforce", Mode::Enforce).await
}

/// A pod the Enforce default forbids, bound while no webhook answers: failurePolicy Ignore
/// binds it, Fail refuses it; once the webhook is back (with the certificate it had: the
/// Secret is reused, not issued again) it is judged again.
#[tokio::test]
async fn the_failure_policy_decides_while_the_webhook_is_down() -> anyhow::Result<()> {
    let test = "the_failure_policy_decides_while_the_webhook_is_down";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let Some(mut w) = webhook(&c, test, "enforce", "Ignore", &[]).await? else {
        return Ok(());
    };
    let node = unique_name("gk-down");
    c.create(&webhook::node(&node, BTreeMap::new(), Some("6.1.0")))
        .await?;
    let forbidden = || unbound_pod(&w.ns, "down", &["kernel.msgmax"]);
    let pods = Api::<Pod>::namespaced(c.client.clone(), &w.ns);
    let configs = Api::<ValidatingWebhookConfiguration>::all(c.client.clone());
    let secrets = Api::<Secret>::namespaced(c.client.clone(), &w.ns);
    let cert = |s: Secret| s.data.unwrap_or_default().get("tls.crt").cloned();

    // Up: denied (once the node is in its cache).
    let p = c.create(&forbidden()).await?;
    wait_for(WAIT, "a forbidden binding to be denied", || async {
        match webhook::bind(&c.client, &w.ns, &p, &node).await {
            Err(kube::Error::Api(e)) if e.message.contains("not allowlisted") => Ok(true),
            Err(kube::Error::Api(e)) if e.message.contains("not known") => Ok(false),
            other => anyhow::bail!("{other:?}"),
        }
    })
    .await?;
    let served = cert(secrets.get(&w.secret).await?);
    assert!(served.is_some());

    // Down, failurePolicy Ignore: bound.
    w.bin.signal("KILL").await?;
    let _ = w.bin.wait_exit(WAIT).await;
    let p = c.create(&forbidden()).await?;
    webhook::bind(&c.client, &w.ns, &p, &node)
        .await
        .map_err(|e| anyhow::anyhow!("Ignore must bind while the webhook is down: {e}"))?;
    assert_eq!(
        pods.get(&p.name_any())
            .await?
            .spec
            .and_then(|s| s.node_name),
        Some(node.clone())
    );

    // Down, failurePolicy Fail: refused, the pod stays unbound.
    let fail = json!({"webhooks": configs.get(&w.config).await?.webhooks.unwrap_or_default().iter()
        .map(|wh| json!({"name": wh.name, "failurePolicy": "Fail"})).collect::<Vec<_>>()});
    // A strategic merge keyed by webhook name keeps the rest of each entry.
    configs
        .patch(&w.config, &PatchParams::default(), &Patch::Strategic(&fail))
        .await?;
    let p = c.create(&forbidden()).await?;
    wait_for(WAIT, "Fail to refuse while the webhook is down", || async {
        match webhook::bind(&c.client, &w.ns, &p, &node).await {
            Err(kube::Error::Api(e)) => {
                assert!(
                    e.message.contains("failed calling webhook"),
                    "refused for another reason: {}",
                    e.message
                );
                Ok(true)
            }
            // The apiserver may not have loaded the new policy yet: unbind is impossible, so
            // a pod bound meanwhile would fail the test below.
            Ok(()) => anyhow::bail!("bound under failurePolicy Fail while the webhook is down"),
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    assert_eq!(
        pods.get(&p.name_any())
            .await?
            .spec
            .and_then(|s| s.node_name),
        None
    );

    // Back: the same certificate, judged again (an allowed pod binds, the forbidden one not).
    let (bin, admin) = start(&w.args, &w.env)?;
    (w.bin, w.admin) = (bin, admin);
    w.wait_called(&c).await?;
    assert_eq!(
        cert(secrets.get(&w.secret).await?),
        served,
        "the Secret was reused"
    );
    let err = webhook::bind(&c.client, &w.ns, &p, &node)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not allowlisted"), "{err}");
    let ok = c
        .create(&unbound_pod(&w.ns, "allowed", &["kernel.shm_rmid_forced"]))
        .await?;
    webhook::bind(&c.client, &w.ns, &ok, &node).await?;
    let _ = w.addr;
    Ok(())
}

/// Two replicas issue and rotate one certificate (60 s lifetime: renewal staged at 40 s,
/// served 2 s after the caBundle holds it). Under failurePolicy Fail, a call the apiserver
/// could not make (an untrusted certificate) would refuse a pod: none is refused across the
/// renewal, and the replaced CA stays trusted.
#[tokio::test]
async fn certificates_rotate_without_a_refused_call() -> anyhow::Result<()> {
    let test = "certificates_rotate_without_a_refused_call";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let rotate = ["--webhook-cert-validity=60s", "--webhook-cert-grace=2s"];
    let Some(w) = webhook(&c, test, "enforce", "Fail", &rotate).await? else {
        return Ok(());
    };
    // A second replica on another port (the configuration calls the first): it races the
    // first for every write.
    let mut other = w.args.clone();
    for a in other
        .iter_mut()
        .filter(|a| a.starts_with("--webhook-addr="))
    {
        *a = format!("--webhook-addr={}", free_addr());
    }
    let (second, second_admin) = start(&other, &w.env)?;
    wait_ready(second_admin, WAIT, "second replica /readyz").await?;

    let secrets = Api::<Secret>::namespaced(c.client.clone(), &w.ns);
    let data = |s: Secret| s.data.unwrap_or_default();
    let first = data(secrets.get(&w.secret).await?);
    let node = unique_name("gk-rotate");
    c.create(&webhook::node(&node, BTreeMap::new(), Some("6.1.0")))
        .await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &w.ns);
    let allowed = bound_pod(&w.ns, "rotate", &node, &["net.core.somaxconn"]);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let steps = |admin| async move {
        let (_, body) = http_get(admin, "/metrics").await?;
        anyhow::Ok(
            body.lines()
                .filter(|l| {
                    l.starts_with(
                        "groundskeeper_sysctl_webhook_certificate_steps_total{step=\"promote\"}",
                    )
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>(),
        )
    };
    // The webhook judges from its Node cache: a call before the new Node's event has reached
    // it is denied (node not known yet), which is not what this test counts.
    wait_for(WAIT, "the webhook to know the node", || async {
        Ok(pods.create(&dry, &allowed).await.is_ok())
    })
    .await?;
    let start = std::time::Instant::now();
    let mut calls = 0;
    loop {
        pods.create(&dry, &allowed).await.map_err(|e| {
            anyhow::anyhow!(
                "call {calls} refused {:?} into the test: {e}\nlog:\n{}",
                start.elapsed(),
                w.bin.logs()
            )
        })?;
        calls += 1;
        if steps(w.admin).await? + steps(second_admin).await? >= 1.0 {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(90),
            "no promotion after 90 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The new certificate is served (the replica reloads it from the Secret) and still trusted.
    let now = data(secrets.get(&w.secret).await?);
    assert_ne!(now.get("tls.crt"), first.get("tls.crt"), "renewed");
    assert_eq!(
        now.get("previous-ca.crt"),
        first.get("tls-ca.crt"),
        "the replaced CA is kept"
    );
    wait_for(
        WAIT,
        "the serving replica to load the renewed certificate",
        || async { Ok(w.bin.logs().matches("serving certificate loaded").count() >= 2) },
    )
    .await?;
    for _ in 0..20 {
        pods.create(&dry, &allowed).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(w.reviews("pod", Some("allowed")).await? >= calls as f64);
    for bin in [&w.bin, &second] {
        assert!(!bin.logs().contains("can not be served"), "{}", bin.logs());
    }
    Ok(())
}

/// The chart's own rules (rendered, resourceNames and all: the Secret and the configuration by
/// name, list/watch of them through a metadata.name field selector) are enough for the webhook
/// to issue its certificate, patch the caBundles, watch what it judges and deny a binding.
#[tokio::test]
async fn the_charts_rules_are_enough_for_the_webhook() -> anyhow::Result<()> {
    let test = "the_charts_rules_are_enough_for_the_webhook";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let ns = c.namespace_for_pods("gk-webhook-rbac", WAIT).await?;
    let release = unique_name("gk");
    let Some(docs) = testkit::chart::render_release(&release, &["-n", &ns]) else {
        testkit::skipped(test, "helm not installed (run .ci/tools.sh)");
        return Ok(());
    };
    let rules = |kind: &str| testkit::chart::rules(&docs, kind, Some("controller-manager"));
    let kubeconfig = c
        .as_service_account_with(&ns, rules("ClusterRole"), rules("Role"))
        .await?;
    let full = format!("{release}-groundskeeper");
    let names = (format!("{full}-sysctl"), format!("{full}-webhook-tls"));
    let Some(w) = webhook_in(
        &c,
        test,
        &ns,
        names,
        "Fail",
        vec!["--sysctl-default-mode=enforce".into()],
        Some(kubeconfig.display().to_string()),
    )
    .await?
    else {
        return Ok(());
    };
    let node = unique_name("gk-rbac");
    c.create(&webhook::node(&node, BTreeMap::new(), Some("6.1.0")))
        .await?;
    let p = c
        .create(&unbound_pod(&w.ns, "rbac", &["kernel.msgmax"]))
        .await?;
    wait_for(WAIT, "a forbidden binding to be denied", || async {
        match webhook::bind(&c.client, &w.ns, &p, &node).await {
            Err(kube::Error::Api(e)) => Ok(e.message.contains("not allowlisted")),
            Ok(()) => anyhow::bail!("bound"),
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    w.bin.assert_no_api_refusals();
    // The reason, not the bare code: "403" also turns up inside generated names.
    assert!(!w.bin.logs().contains("Forbidden"), "{}", w.bin.logs());
    Ok(())
}

/// `POST .../namespaces/NS/bindings` binds a pod as `pods/binding` does: judged the same.
#[tokio::test]
async fn the_older_bindings_resource_is_judged_too() -> anyhow::Result<()> {
    let test = "the_older_bindings_resource_is_judged_too";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let Some(w) = webhook(&c, test, "enforce", "Fail", &[]).await? else {
        return Ok(());
    };
    let node = unique_name("gk-legacy");
    c.create(&webhook::node(&node, BTreeMap::new(), Some("6.1.0")))
        .await?;
    let forbidden = c
        .create(&unbound_pod(&w.ns, "legacy", &["kernel.msgmax"]))
        .await?;
    wait_for(WAIT, "a forbidden legacy binding to be denied", || async {
        match webhook::bind_legacy(&c.client, &w.ns, &forbidden, &node).await {
            Err(kube::Error::Api(e)) if e.message.contains("not known") => Ok(false),
            Err(kube::Error::Api(e)) => {
                assert!(
                    e.message.contains("binding.sysctl.groundskeeper.dev")
                        && e.message.contains("not allowlisted"),
                    "{}",
                    e.message
                );
                Ok(true)
            }
            other => anyhow::bail!("{other:?}"),
        }
    })
    .await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &w.ns);
    assert_eq!(
        pods.get(&forbidden.name_any())
            .await?
            .spec
            .and_then(|s| s.node_name),
        None
    );
    let allowed = c
        .create(&unbound_pod(&w.ns, "legacy", &["kernel.shm_rmid_forced"]))
        .await?;
    webhook::bind_legacy(&c.client, &w.ns, &allowed, &node).await?;
    assert_eq!(
        pods.get(&allowed.name_any())
            .await?
            .spec
            .and_then(|s| s.node_name),
        Some(node)
    );
    Ok(())
}

/// A cluster mid-upgrade: two Nodes whose kubelets report v1.36 and v1.37. The same pod, setting
/// `net.ipv4.tcp_slow_start_after_idle` (safe from v1.37 on), is denied its binding to the v1.36
/// node and bound to the v1.37 one: the webhook reads each Node's `kubeletVersion`.
#[tokio::test]
async fn each_node_is_judged_by_its_own_kubelet_version() -> anyhow::Result<()> {
    let test = "each_node_is_judged_by_its_own_kubelet_version";
    let Some(c) = testkit::cluster(test).await else {
        return Ok(());
    };
    let Some(w) = webhook(&c, test, "enforce", "Fail", &[]).await? else {
        return Ok(());
    };
    let sysctl = "net.ipv4.tcp_slow_start_after_idle";
    let mut nodes = Vec::new();
    for version in ["v1.36.2", "v1.37.0"] {
        let name = unique_name("gk-kubelet");
        let mut node = webhook::node(&name, BTreeMap::new(), Some("6.1.0-18-amd64"));
        let info = node.status.as_mut().and_then(|s| s.node_info.as_mut());
        info.expect("nodeInfo").kubelet_version = version.into();
        c.create(&node).await?;
        nodes.push(name);
    }
    let pods = Api::<Pod>::namespaced(c.client.clone(), &w.ns);
    let old = c.create(&unbound_pod(&w.ns, "v136", &[sysctl])).await?;
    wait_for(
        WAIT,
        "the binding to the v1.36 node to be denied",
        || async {
            match webhook::bind(&c.client, &w.ns, &old, &nodes[0]).await {
                Err(kube::Error::Api(e)) if e.message.contains("not known") => Ok(false),
                Err(kube::Error::Api(e)) => {
                    assert!(
                        e.message.contains(&format!("{sysctl:?} not allowlisted"))
                            && !e.message.contains("judged as"),
                        "{}",
                        e.message
                    );
                    Ok(true)
                }
                Ok(()) => anyhow::bail!("bound to the v1.36 node"),
                Err(e) => Err(e.into()),
            }
        },
    )
    .await?;
    let new = c.create(&unbound_pod(&w.ns, "v137", &[sysctl])).await?;
    wait_for(
        WAIT,
        "the binding to the v1.37 node to be allowed",
        || async {
            match webhook::bind(&c.client, &w.ns, &new, &nodes[1]).await {
                Ok(()) => Ok(true),
                Err(kube::Error::Api(e)) if e.message.contains("not known") => Ok(false),
                Err(e) => anyhow::bail!("refused: {e}"),
            }
        },
    )
    .await?;
    assert_eq!(
        pods.get(&new.name_any())
            .await?
            .spec
            .and_then(|s| s.node_name),
        Some(nodes[1].clone())
    );
    assert_eq!(
        pods.get(&old.name_any())
            .await?
            .spec
            .and_then(|s| s.node_name),
        None
    );
    Ok(())
}
