//! The sysctl scheduling gate and placement against a real kube-apiserver and the real
//! kube-scheduler (and, for the ReplicaSet, the real kube-controller-manager), on fake Ready
//! Nodes. The chart's own webhook configurations are registered, narrowed to the test's
//! namespace and pointed at a controller-manager on 127.0.0.1: first with no replica answering
//! (pods that set sysctls are not created, every other pod schedules as before), then with one.
//!
//! Every Node, SysctlPolicy and pod of a test carries the test's own label value (pods by
//! nodeSelector), so tests sharing the apiserver and the scheduler never see each other's nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use groundskeeper_sysctl_rules::crd::{Mode, SysctlPolicy, SysctlPolicySpec, crd_yaml};
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use testkit::components::{self, Component};
use testkit::{Binary, Cluster, free_addr, http_get, unique_name, wait_for, wait_ready, webhook};

const WAIT: Duration = Duration::from_secs(60);
const RUN_LABEL: &str = "groundskeeper.dev/sysctl-placement-test";
const GATE: &str = "groundskeeper.dev/sysctl";
const SYSCTL: &str = "net.core.somaxconn";

/// The scheduler every test of this binary shares (one control plane per test binary).
fn scheduler(test: &str) -> Option<&'static Component> {
    static SCHEDULER: OnceLock<Result<Option<Component>, String>> = OnceLock::new();
    let started = SCHEDULER.get_or_init(|| {
        let Some(cp) = testkit::control_plane::started() else {
            return Ok(None);
        };
        let Some(bin) = components::binary("kube-scheduler").map_err(|e| format!("{e:#}"))? else {
            return Ok(None);
        };
        Component::scheduler(&bin, cp, &[])
            .map(Some)
            .map_err(|e| format!("{e:#}"))
    });
    match started {
        Ok(Some(s)) => Some(s),
        Ok(None) => {
            testkit::skipped(
                test,
                "no kube-scheduler: set KUBE_SCHEDULER, or KUBE_APISERVER beside the node tarball",
            );
            None
        }
        Err(e) => panic!("starting kube-scheduler: {e}"),
    }
}

/// One test's namespace, label value, webhook configurations and (once started) the
/// controller-manager serving them.
struct Scene {
    c: Cluster,
    ns: String,
    run: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    gk: Option<(Binary, SocketAddr)>,
    scheduler: &'static Component,
}

impl Scene {
    /// The configurations registered for a controller-manager at an address where nothing
    /// listens yet: every replica down. None when a tool is missing (skipped). With `as_chart`,
    /// the controller-manager acts as a ServiceAccount with exactly the chart's rendered RBAC,
    /// under the chart's admission policy for its pod patches, with the chart's names.
    async fn new(test: &str, as_chart: bool) -> anyhow::Result<Option<Scene>> {
        let Some(c) = testkit::cluster(test).await else {
            return Ok(None);
        };
        let Some(scheduler) = scheduler(test) else {
            return Ok(None);
        };
        c.ensure_crd(&crd_yaml()).await?;
        let ns = c.namespace_for_pods("gk-placement", WAIT).await?;
        let addr = free_addr();
        let release = unique_name("gk");
        let full = format!("{release}-groundskeeper");
        let (vwc, mwc, secret) = if as_chart {
            (
                format!("{full}-sysctl"),
                format!("{full}-sysctl-gate"),
                format!("{full}-webhook-tls"),
            )
        } else {
            (
                unique_name("gk-sysctl"),
                unique_name("gk-sysctl-gate"),
                unique_name("gk-webhook-tls"),
            )
        };
        // The chart's defaults: the binding webhook fails open, the gate fails closed.
        let (Some(validating), Some(mutating)) = (
            webhook::chart_configuration(&vwc, addr, &ns, "Ignore"),
            webhook::chart_gate_configuration(&mwc, addr, &ns),
        ) else {
            testkit::skipped(test, "helm not installed (run .ci/tools.sh)");
            return Ok(None);
        };
        c.create(&validating).await?;
        c.create(&mutating).await?;
        let mut env = vec![("POD_NAMESPACE".to_string(), ns.clone())];
        if as_chart {
            let kubeconfig = as_chart_account(&c, &ns, &release).await?;
            env.push(("KUBECONFIG".into(), kubeconfig));
        }
        let args = [
            "--leader-elect=false",
            "--controllers=sysctlplacement",
            "--sysctl-webhook",
            &format!("--webhook-addr={addr}"),
            "--webhook-cert-hosts=127.0.0.1",
            &format!("--webhook-configuration={vwc}"),
            &format!("--webhook-mutating-configuration={mwc}"),
            &format!("--webhook-tls-secret={secret}"),
            "--sysctl-default-mode=enforce",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Ok(Some(Scene {
            c,
            ns,
            run: unique_name("run"),
            args,
            env,
            gk: None,
            scheduler,
        }))
    }

    /// A Ready Node labelled with the run and `role`.
    async fn node(&self, role: &str) -> anyhow::Result<String> {
        let name = unique_name(&format!("gk-{role}"));
        let labels = [
            (RUN_LABEL.to_string(), self.run.clone()),
            ("role".to_string(), role.to_string()),
        ]
        .into();
        self.c
            .create(&webhook::ready_node(&name, labels, "6.1.0", "v1.36.2"))
            .await?;
        // The apiserver's TaintNodesByCondition admission taints a new Node not-ready; the node
        // lifecycle controller would lift it once kubelet reports Ready.
        Api::<Node>::all(self.c.client.clone())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await?;
        Ok(name)
    }

    /// An Enforce SysctlPolicy for this run's nodes of `role`, allowing `allow`.
    async fn policy(&self, name: &str, role: &str, allow: &[&str]) -> anyhow::Result<String> {
        let name = unique_name(name);
        self.c
            .create(&SysctlPolicy::new(
                &name,
                SysctlPolicySpec {
                    allowed_unsafe_sysctls: allow.iter().map(|s| s.to_string()).collect(),
                    node_selector: Some(LabelSelector {
                        match_labels: Some(
                            [
                                (RUN_LABEL.to_string(), self.run.clone()),
                                ("role".to_string(), role.to_string()),
                            ]
                            .into(),
                        ),
                        ..Default::default()
                    }),
                    mode: Mode::Enforce,
                },
            ))
            .await?;
        Ok(name)
    }

    /// A pod confined to this run's nodes, setting `sysctls` (none: an ordinary pod).
    fn pod(&self, prefix: &str, sysctls: &[&str]) -> Pod {
        let mut pod = testkit::bound_pod(&self.ns, &unique_name(prefix), "");
        let spec = pod.spec.as_mut().expect("a spec");
        spec.node_name = None;
        spec.node_selector = Some([(RUN_LABEL.to_string(), self.run.clone())].into());
        if !sysctls.is_empty() {
            spec.security_context = Some(testkit::sysctls(sysctls));
        }
        pod
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.c.client.clone(), &self.ns)
    }

    /// Starts the controller-manager (webhook and placement) and waits until the apiserver
    /// gates a pod through it.
    async fn start(&mut self) -> anyhow::Result<()> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let (bin, admin) = Binary::start_with_admin(
            env!("CARGO_BIN_EXE_controller-manager"),
            "controller-manager-placement",
            &args,
            &env,
        )?;
        wait_ready(admin, WAIT, "controller-manager /readyz")
            .await
            .map_err(|e| anyhow::anyhow!("{e}\nlog:\n{}", bin.logs()))?;
        let probe = self.pod("probe", &[SYSCTL]);
        let pods = self.pods();
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let gated = wait_for(
            WAIT,
            "the apiserver to gate a pod through the webhook",
            || async {
                Ok(pods
                    .create(&dry, &probe)
                    .await
                    .is_ok_and(|p| gates(&p).contains(&GATE.to_string())))
            },
        )
        .await;
        let logs = bin.logs();
        self.gk = Some((bin, admin));
        gated
            .map(drop)
            .map_err(|e| anyhow::anyhow!("{e}\nlog:\n{logs}"))
    }

    /// Each pod named, once all have a node: pod name → node. Fails after WAIT.
    async fn wait_bound(&self, names: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
        let pods = self.pods();
        let deadline = Instant::now() + WAIT;
        loop {
            let mut bound = BTreeMap::new();
            for n in names {
                if let Some(node) = pods.get(n).await?.spec.and_then(|s| s.node_name) {
                    bound.insert(n.clone(), node);
                }
            }
            if bound.len() == names.len() {
                return Ok(bound);
            }
            if Instant::now() > deadline {
                let waiting = names.iter().find(|n| !bound.contains_key(*n)).unwrap();
                let pod = pods.get(waiting).await?;
                anyhow::bail!(
                    "{} of {} pods scheduled after {WAIT:?}: {bound:?}; {waiting}: {:?} {:?}\nscheduler:\n{}",
                    bound.len(),
                    names.len(),
                    pod.spec.map(|s| (s.scheduling_gates, s.affinity)),
                    pod.status.and_then(|s| s.conditions),
                    tail(&self.scheduler.logs())
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn tail(s: &str) -> String {
    s.lines()
        .filter(|l| !l.contains("extension-apiserver-authentication"))
        .rev()
        .take(30)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n")
}

fn gates(p: &Pod) -> Vec<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .map(|g| g.iter().map(|g| g.name.clone()).collect())
        .unwrap_or_default()
}

/// With every replica down, pods that set sysctls are not created (0 bound anywhere) and
/// ordinary pods schedule as if groundskeeper were not installed; with a replica running, a
/// pod allowed only on node B lands on B, also when it brings required node affinity of its
/// own, and ordinary pods still schedule.
#[tokio::test]
async fn fails_closed_for_sysctl_pods_only_then_places_them_where_allowed() -> anyhow::Result<()> {
    let test = "fails_closed_for_sysctl_pods_only_then_places_them_where_allowed";
    let Some(mut s) = Scene::new(test, false).await? else {
        return Ok(());
    };
    let a = s.node("a").await?;
    let b = s.node("b").await?;
    s.policy("enforce-a", "a", &[]).await?;
    s.policy("allow-b", "b", &[SYSCTL]).await?;
    let pods = s.pods();

    // Every replica down: nothing listens at the configurations' address.
    let n = 10;
    let mut refused = 0;
    for _ in 0..n {
        match pods
            .create(&PostParams::default(), &s.pod("sysctl", &[SYSCTL]))
            .await
        {
            Err(kube::Error::Api(e)) => {
                assert!(
                    e.message.contains("gate.sysctl.groundskeeper.dev"),
                    "{}",
                    e.message
                );
                refused += 1;
            }
            Err(e) => return Err(e.into()),
            Ok(p) => panic!("created with every replica down: {}", p.name_any()),
        }
    }
    let mut plain = Vec::new();
    for _ in 0..n {
        plain.push(
            pods.create(&PostParams::default(), &s.pod("plain", &[]))
                .await?
                .name_any(),
        );
    }
    let bound = s.wait_bound(&plain).await?;
    let sysctl_pods = pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.sysctls.as_ref())
                .is_some_and(|s| !s.is_empty())
        })
        .count();
    assert_eq!((refused, sysctl_pods), (n, 0));
    println!(
        "sysctl fail-closed: 0 of {n} forbidden pods created or bound with every webhook replica down; {} of {n} other pods scheduled",
        bound.len()
    );

    // A replica running.
    s.start().await?;
    let mut placed = Vec::new();
    for _ in 0..n {
        let p = pods
            .create(&PostParams::default(), &s.pod("sysctl", &[SYSCTL]))
            .await?;
        assert_eq!(gates(&p), [GATE], "created gated");
        placed.push(p.name_any());
    }
    // Its own required affinity, two terms: the placement may only narrow each.
    for _ in 0..2 {
        let mut p = s.pod("own-affinity", &[SYSCTL]);
        p.spec.as_mut().unwrap().affinity = Some(serde_json::from_value(json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "role", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": RUN_LABEL, "operator": "Exists"}]},
        ]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["a"]}]}}
        ]}}))?);
        placed.push(pods.create(&PostParams::default(), &p).await?.name_any());
    }
    let mut more_plain = Vec::new();
    for _ in 0..5 {
        more_plain.push(
            pods.create(&PostParams::default(), &s.pod("plain", &[]))
                .await?
                .name_any(),
        );
    }
    let bound = s.wait_bound(&placed).await?;
    let on: BTreeSet<&String> = bound.values().collect();
    assert_eq!(
        on,
        BTreeSet::from([&b]),
        "every sysctl pod on b, none on {a}"
    );
    s.wait_bound(&more_plain).await?;
    for name in &placed {
        let p = pods.get(name).await?;
        assert!(gates(&p).is_empty(), "{name}: gate removed");
    }
    println!(
        "sysctl placement: {} of {} pods allowed only on node b bound to b, 0 to a; {} other pods scheduled",
        bound.len(),
        placed.len(),
        more_plain.len()
    );
    Ok(())
}

/// The webhook and the placement of one process share one set of sysctl watches: one watch of
/// Nodes, of SysctlPolicies and of pods not yet bound, each flagged `sysctl/<kind>`, beside the
/// webhook's own (its Secret and configurations). Every watch of the process is in the `watch`
/// label of `groundskeeper_watch_stale_seconds`.
#[tokio::test]
async fn the_webhook_and_the_placement_share_one_watch_of_each_kind() -> anyhow::Result<()> {
    let test = "the_webhook_and_the_placement_share_one_watch_of_each_kind";
    let Some(mut s) = Scene::new(test, false).await? else {
        return Ok(());
    };
    s.start().await?;
    let (_, admin) = s.gk.as_ref().expect("started");
    let (_, metrics) = http_get(*admin, "/metrics").await?;
    let watches: BTreeSet<&str> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("groundskeeper_watch_stale_seconds{"))
        .filter_map(|l| l.split("watch=\"").nth(1)?.split('"').next())
        .collect();
    for kind in ["nodes", "sysctlpolicies", "pods"] {
        let of_kind: Vec<&str> = watches
            .iter()
            .copied()
            .filter(|w| w.ends_with(&format!("/{kind}")))
            .collect();
        assert_eq!(of_kind, [format!("sysctl/{kind}")], "{watches:?}");
    }
    for own in ["sysctlwebhook/secrets", "sysctlwebhook/certificate"] {
        assert!(watches.contains(own), "{own}: {watches:?}");
    }
    println!(
        "sysctl watches: one of Nodes, SysctlPolicies and pending pods for the webhook and the placement ({} watches in all: {watches:?})",
        watches.len()
    );
    Ok(())
}

/// A ReplicaSet whose pods no node admits: each pod stays Pending behind the gate with a
/// condition and an Event saying why, the ReplicaSet recreates nothing (its pod count stays
/// flat), and once a SysctlPolicy allows the sysctl on node b the pods are placed there.
#[tokio::test]
async fn a_pod_no_node_admits_stays_pending_and_its_replicaset_stays_flat() -> anyhow::Result<()> {
    let test = "a_pod_no_node_admits_stays_pending_and_its_replicaset_stays_flat";
    let Some(mut s) = Scene::new(test, false).await? else {
        return Ok(());
    };
    let Some(kcm_bin) = components::binary("kube-controller-manager")? else {
        testkit::skipped(test, "no kube-controller-manager beside KUBE_APISERVER");
        return Ok(());
    };
    let cp = s.c.control_plane.expect("a throwaway control plane");
    let _kcm = Component::controller_manager(&kcm_bin, cp, "replicaset")?;
    s.node("a").await?;
    let b = s.node("b").await?;
    let enforce = s.policy("enforce-all", "a", &[]).await?;
    let enforce_b = s.policy("enforce-b", "b", &[]).await?;
    s.start().await?;

    let replicas = 3;
    let app = unique_name("app");
    let template = s.pod("rs", &[SYSCTL]);
    let rs = ReplicaSet {
        metadata: ObjectMeta {
            name: Some(app.clone()),
            namespace: Some(s.ns.clone()),
            ..Default::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some([("app".to_string(), app.clone())].into()),
                ..Default::default()
            },
            template: Some(PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some([("app".to_string(), app.clone())].into()),
                    ..Default::default()
                }),
                spec: template.spec,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    s.c.create(&rs).await?;
    let pods = s.pods();
    let of_app = ListParams::default().labels(&format!("app={app}"));
    let condition = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "groundskeeper.dev/SysctlPlacement")
                    .cloned()
            })
    };
    wait_for(WAIT, "every pod held with its reason", || async {
        let items = pods.list(&of_app).await?.items;
        Ok(items.len() == replicas as usize
            && items
                .iter()
                .all(|p| condition(p).is_some_and(|c| c.status == "False")))
    })
    .await?;
    let items = pods.list(&of_app).await?.items;
    let message = condition(&items[0]).unwrap().message.unwrap_or_default();
    assert_eq!(
        message,
        format!(
            "no node admits {SYSCTL}: 1 node forbids it by SysctlPolicy {enforce}, 1 by SysctlPolicy {enforce_b}"
        )
    );
    let events: Api<Event> = Api::namespaced(s.c.client.clone(), &s.ns);
    wait_for(WAIT, "a NoNodeAdmitsSysctls Event", || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("NoNodeAdmitsSysctls")
                    && e.note.as_deref() == Some(message.as_str())
            }))
    })
    .await?;

    // Flat: the same pods, Pending and gated, for 20 s.
    let names: BTreeSet<String> = items.iter().map(|p| p.name_any()).collect();
    let until = Instant::now() + Duration::from_secs(20);
    let mut samples = 0;
    while Instant::now() < until {
        let now = pods.list(&of_app).await?.items;
        let now_names: BTreeSet<String> = now.iter().map(|p| p.name_any()).collect();
        assert_eq!(now_names, names, "the ReplicaSet's pods changed");
        for p in &now {
            assert_eq!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Pending")
            );
            assert_eq!(gates(p), [GATE]);
            assert!(p.spec.as_ref().unwrap().node_name.is_none());
        }
        samples += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "sysctl placement: a ReplicaSet of {replicas} pods no node admits kept the same {replicas} pods, Pending and gated, over 20 s ({samples} samples)"
    );

    // A policy now allows the sysctl on b: the held pods are judged again and placed there.
    s.policy("allow-b", "b", &[SYSCTL]).await?;
    let names: Vec<String> = names.into_iter().collect();
    let bound = s.wait_bound(&names).await?;
    assert!(bound.values().all(|n| *n == b), "{bound:?}");
    for n in &names {
        let c = condition(&pods.get(n).await?).unwrap();
        assert_eq!(c.status, "True", "{n}: {c:?}");
    }
    Ok(())
}

/// A ServiceAccount in `ns` bound to exactly the controller-manager's rules the chart renders
/// for `release`, and the chart's admission policy for its pod patches, rendered for that
/// account: a kubeconfig acting as it.
async fn as_chart_account(c: &Cluster, ns: &str, release: &str) -> anyhow::Result<String> {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let docs = testkit::chart::render_release(release, &["-n", ns]).expect("helm renders");
    let rules = |kind: &str| testkit::chart::rules(&docs, kind, Some("controller-manager"));
    let kubeconfig = c
        .as_service_account_with(ns, rules("ClusterRole"), rules("Role"))
        .await?;
    let kc: serde_norway::Value = serde_norway::from_str(&std::fs::read_to_string(&kubeconfig)?)?;
    let user = kc["users"][0]["user"]["as"]
        .as_str()
        .expect("impersonated")
        .to_string();
    let sa = user
        .rsplit(':')
        .next()
        .expect("a ServiceAccount")
        .to_string();
    let guard = testkit::chart::render_release(
        release,
        &[
            "-n",
            ns,
            "--set",
            &format!("controllerManager.serviceAccount.name={sa}"),
            "--show-only",
            "templates/sysctl-placement-guard.yaml",
        ],
    )
    .expect("helm renders");
    let find = |kind: &str| {
        guard
            .iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .cloned()
            .unwrap_or_else(|| panic!("the chart renders a {kind} for the placement"))
    };
    let vap: ValidatingAdmissionPolicy =
        serde_norway::from_value(find("ValidatingAdmissionPolicy"))?;
    let vapb: ValidatingAdmissionPolicyBinding =
        serde_norway::from_value(find("ValidatingAdmissionPolicyBinding"))?;
    c.create(&vap).await?;
    c.create(&vapb).await?;
    Ok(kubeconfig.display().to_string())
}

/// With the chart's RBAC and admission policy: the placement's writes go through (a pod lands
/// on the only node that admits it, a held pod gets its condition), and the same account can
/// not change a pod that carries no gate, nor a gated pod's image.
#[tokio::test]
async fn the_charts_rbac_and_admission_policy_let_the_placement_write_and_no_more()
-> anyhow::Result<()> {
    let test = "the_charts_rbac_and_admission_policy_let_the_placement_write_and_no_more";
    let Some(mut s) = Scene::new(test, true).await? else {
        return Ok(());
    };
    s.node("a").await?;
    let b = s.node("b").await?;
    s.policy("enforce-a", "a", &[]).await?;
    s.policy("allow-b", "b", &[SYSCTL]).await?;
    let kubeconfig = s
        .env
        .iter()
        .find(|(k, _)| k == "KUBECONFIG")
        .unwrap()
        .1
        .clone();
    let as_gk = testkit::client_for(std::path::Path::new(&kubeconfig)).await?;
    let theirs = Api::<Pod>::namespaced(as_gk, &s.ns);
    let pods = s.pods();

    // Before the controller-manager runs: a pod without the gate, and a gated one.
    let plain = pods
        .create(&PostParams::default(), &s.pod("plain", &[]))
        .await?;
    let mut gated = s.pod("gated", &[]);
    gated.spec.as_mut().unwrap().scheduling_gates = Some(serde_json::from_value(
        json!([{"name": GATE}, {"name": "example.com/hold"}]),
    )?);
    let gated = pods.create(&PostParams::default(), &gated).await?;
    let label = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    wait_for(WAIT, "the admission policy to refuse a pod without the gate", || async {
        Ok(matches!(
            theirs.patch(&plain.name_any(), &PatchParams::default(), &label).await,
            Err(kube::Error::Api(e)) if e.message.contains("only update pods that carry the scheduling gate")
        ))
    })
    .await?;
    let image = Patch::Strategic(
        json!({"spec": {"containers": [{"name": "c", "image": "registry.invalid/other"}]}}),
    );
    match theirs
        .patch(&gated.name_any(), &PatchParams::default(), &image)
        .await
    {
        // Refused: by the policy's rule for gated pods, or (on a loaded apiserver whose
        // policy is still settling) by its first rule; what matters is that nothing changed.
        Err(kube::Error::Api(e)) => assert!(
            e.code == 403 || e.code == 422,
            "the image patch of a gated pod was refused for another reason: {} {}",
            e.code,
            e.message
        ),
        other => panic!("the image of a gated pod changed: {other:?}"),
    }
    let kept = pods.get(&gated.name_any()).await?;
    assert_eq!(
        kept.spec.as_ref().map(|s| s.containers[0].image.clone()),
        gated.spec.as_ref().map(|s| s.containers[0].image.clone()),
        "the image of a gated pod changed"
    );

    s.start().await?;
    let placed = pods
        .create(&PostParams::default(), &s.pod("sysctl", &[SYSCTL]))
        .await?
        .name_any();
    let bound = s.wait_bound(&[placed]).await?;
    assert!(bound.values().all(|n| *n == b), "{bound:?}");
    let nowhere = pods
        .create(
            &PostParams::default(),
            &s.pod("nowhere", &["kernel.msgmax"]),
        )
        .await?
        .name_any();
    wait_for(WAIT, "the held pod's condition", || async {
        Ok(pods
            .get(&nowhere)
            .await?
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "groundskeeper.dev/SysctlPlacement" && c.status == "False")
            }))
    })
    .await?;
    // The gated pod carrying another gate too: placed (it sets no sysctl), the other gate kept.
    wait_for(
        WAIT,
        "our gate off the pod that also carries another",
        || async { Ok(gates(&pods.get(&gated.name_any()).await?) == ["example.com/hold"]) },
    )
    .await?;
    Ok(())
}
