//! Test harness for cluster tests: a real kube-apiserver (the cluster named by `KUBECONFIG`, or
//! a throwaway control plane started from `KUBE_APISERVER`), the project's binaries as child
//! processes, uniquely named objects, bounded waits, and cleanup that runs even when a test
//! fails.
//!
//! With neither variable set every cluster test prints one `SKIPPED <test>: …` line and passes:
//! the skip is visible, never silent; under `CI=true` it fails instead ([`skipped`]). Tests never pick a cluster on their own (no
//! `~/.kube/config`, no in-cluster config): only the one they were told to use.

pub mod alloc;
pub mod api;
pub mod audit;
mod binary;
pub mod chart;
pub mod cli;
pub mod components;
pub mod control_plane;
pub mod figures;
pub mod hostile;
pub mod leases;
pub mod networking;
pub mod proxy;
mod rbac;
pub mod rng;
pub mod seed;
pub mod services;
pub mod webhook;

pub use binary::Binary;
pub use control_plane::ControlPlane;

use std::{
    future::Future,
    path::PathBuf,
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, Config, Resource, ResourceExt,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    discovery::ApiResource,
};

/// A connection to the test cluster; deletes every object it tracks when dropped.
pub struct Cluster {
    pub client: Client,
    pub kubeconfig: PathBuf,
    /// The control plane the tests started, when they did (not with `KUBECONFIG`).
    pub control_plane: Option<&'static ControlPlane>,
    tracked: Mutex<Vec<Tracked>>,
}

struct Tracked {
    resource: ApiResource,
    namespace: Option<String>,
    name: String,
}

/// [`cluster`] and a fresh namespace named after `prefix`, for a test that also needs network
/// namespaces: `None` (after the skip line) when the cluster is not there or `netns_missing`
/// says why network namespaces are not.
pub async fn netns_cluster(
    test_name: &str,
    prefix: &str,
    netns_missing: Option<String>,
) -> anyhow::Result<Option<(Cluster, String)>> {
    let Some(c) = cluster(test_name).await else {
        return Ok(None);
    };
    if let Some(why) = netns_missing {
        skipped(test_name, &format!("needs root and ip netns ({why})"));
        return Ok(None);
    }
    let ns = c.namespace(prefix).await?;
    Ok(Some((c, ns)))
}

/// Connects to the cluster named by `KUBECONFIG`; without it, to this test binary's throwaway
/// control plane when `KUBE_APISERVER` is set; otherwise prints the skip line and returns None.
pub async fn cluster(test_name: &str) -> Option<Cluster> {
    if let Some(path) = kubeconfig_from_env() {
        return Some(Cluster::connect(path, None).await);
    }
    if ControlPlane::configured().is_none() {
        skipped(
            test_name,
            "neither KUBECONFIG nor KUBE_APISERVER set (see docs/testing.md)",
        );
        return None;
    }
    let cp = control_plane::shared().unwrap_or_else(|e| panic!("{e:#}"));
    Some(Cluster::connect(cp.kubeconfig.clone(), Some(cp)).await)
}

/// A control plane of the test's own, for tests that stop or restart the apiserver; only with
/// `KUBE_APISERVER` (a cluster named by `KUBECONFIG` is not ours to restart). The returned
/// `Cluster` must be dropped before the `ControlPlane`, so its cleanup still reaches it.
pub async fn private_cluster(test_name: &str) -> Option<(Cluster, Box<ControlPlane>)> {
    private_cluster_with(test_name, &[]).await
}

/// [`private_cluster`] with extra etcd flags (see [`ControlPlane::start_with`]).
pub async fn private_cluster_with(
    test_name: &str,
    etcd_args: &[&str],
) -> Option<(Cluster, Box<ControlPlane>)> {
    private_cluster_on(test_name, None, etcd_args).await
}

/// [`private_cluster_with`] on `etcd` instead of the configured etcd, when given (a test that
/// needs what only a newer etcd does).
pub async fn private_cluster_on(
    test_name: &str,
    etcd: Option<PathBuf>,
    etcd_args: &[&str],
) -> Option<(Cluster, Box<ControlPlane>)> {
    let Some((apiserver, configured_etcd)) = ControlPlane::configured() else {
        skipped(
            test_name,
            "KUBE_APISERVER not set (this test restarts the apiserver it starts)",
        );
        return None;
    };
    let etcd = etcd.unwrap_or(configured_etcd);
    let etcd_args: Vec<String> = etcd_args.iter().map(|a| a.to_string()).collect();
    let cp = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = etcd_args.iter().map(String::as_str).collect();
        ControlPlane::start_with(&apiserver, &etcd, &args)
    })
    .await
    .expect("control plane start")
    .unwrap_or_else(|e| panic!("starting a private control plane: {e:#}"));
    let cp = Box::new(cp);
    let cluster = Cluster::connect(cp.kubeconfig.clone(), None).await;
    Some((cluster, cp))
}

fn kubeconfig_from_env() -> Option<PathBuf> {
    std::env::var_os("KUBECONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The kubeconfig a child binary gets unless the test names another: the one the tests use.
pub(crate) fn default_kubeconfig() -> Option<PathBuf> {
    kubeconfig_from_env().or_else(|| control_plane::started().map(|cp| cp.kubeconfig.clone()))
}

impl Cluster {
    async fn connect(kubeconfig: PathBuf, control_plane: Option<&'static ControlPlane>) -> Self {
        let client = client_for(&kubeconfig)
            .await
            .unwrap_or_else(|e| panic!("kubeconfig {} is unusable: {e:#}", kubeconfig.display()));
        // Fail fast and clearly if the apiserver is not there, rather than at the first wait.
        client.apiserver_version().await.unwrap_or_else(|e| {
            panic!(
                "the apiserver of kubeconfig {} does not answer: {e}",
                kubeconfig.display()
            )
        });
        Cluster {
            client,
            kubeconfig,
            control_plane,
            tracked: Mutex::new(Vec::new()),
        }
    }
}

pub async fn client_for(kubeconfig: &std::path::Path) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

impl Cluster {
    /// Deletes `obj` (finalizers stripped first) when the cluster handle is dropped.
    pub fn track<K>(&self, obj: &K)
    where
        K: Resource<DynamicType = ()>,
    {
        self.tracked.lock().unwrap().push(Tracked {
            resource: ApiResource::erase::<K>(&()),
            namespace: obj.meta().namespace.clone(),
            name: obj.meta().name.clone().expect("tracked objects have names"),
        });
    }

    /// Creates `obj` and tracks it for cleanup.
    pub async fn create<K>(&self, obj: &K) -> anyhow::Result<K>
    where
        K: Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
    {
        let resource = ApiResource::erase::<K>(&());
        let api: Api<DynamicObject> = match obj.meta().namespace.as_deref() {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        let mut value = serde_json::to_value(obj)?;
        value["apiVersion"] = resource.api_version.clone().into();
        value["kind"] = resource.kind.clone().into();
        let dynamic: DynamicObject = serde_json::from_value(value)?;
        let created = api.create(&PostParams::default(), &dynamic).await?;
        let created: K = serde_json::from_value(serde_json::to_value(created)?)?;
        self.track(&created);
        Ok(created)
    }

    /// Installs a CRD from its YAML unless it is there, and waits until it is established.
    /// Never deleted: a CRD is cluster-wide and other tests of the same cluster may use it.
    pub async fn ensure_crd(&self, yaml: &str) -> anyhow::Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let crd: CustomResourceDefinition = serde_norway::from_str(yaml)?;
        let name = crd.name_any();
        if api.get_opt(&name).await?.is_none() {
            match api.create(&PostParams::default(), &crd).await {
                Ok(_) => {}
                // Another test installed it first.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        wait_for(
            Duration::from_secs(30),
            &format!("the CRD {name} to be established"),
            || async {
                let crd = api.get(&name).await?;
                Ok(crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True"))
            },
        )
        .await?;
        Ok(())
    }

    /// A fresh namespace, deleted at drop.
    pub async fn namespace(&self, prefix: &str) -> anyhow::Result<String> {
        let name = unique_name(prefix);
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("groundskeeper.dev/test".to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<Namespace> = Api::all(self.client.clone());
        let created = api.create(&PostParams::default(), &ns).await?;
        self.track(&created);
        // kube-controller-manager would create it; pods need it (ServiceAccount admission).
        let sa = k8s_openapi::api::core::v1::ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client.clone(), &name);
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(created.name_any())
    }

    /// A fresh namespace (as [`Cluster::namespace`]) once its default ServiceAccount is
    /// served, waited for up to `within`: pods are admitted only then, and with a cluster named
    /// by `KUBECONFIG` it may be kube-controller-manager's copy that arrives.
    pub async fn namespace_for_pods(
        &self,
        prefix: &str,
        within: Duration,
    ) -> anyhow::Result<String> {
        let ns = self.namespace(prefix).await?;
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client.clone(), &ns);
        wait_for(within, "the default ServiceAccount", || async {
            Ok(sas.get_opt("default").await?.is_some())
        })
        .await?;
        Ok(ns)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let tracked = std::mem::take(&mut *self.tracked.lock().unwrap());
        if tracked.is_empty() {
            return;
        }
        let kubeconfig = self.kubeconfig.clone();
        // The test's runtime is being torn down around us: clean up on a thread of our own,
        // with a client of our own.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let Ok(client) = client_for(&kubeconfig).await else {
                    return;
                };
                for t in tracked.iter().rev() {
                    let api: Api<DynamicObject> = match &t.namespace {
                        Some(ns) => Api::namespaced_with(client.clone(), ns, &t.resource),
                        None => Api::all_with(client.clone(), &t.resource),
                    };
                    let strip = serde_json::json!({"metadata": {"finalizers": null}});
                    let _ = api
                        .patch(&t.name, &PatchParams::default(), &Patch::Merge(&strip))
                        .await;
                    let _ = api
                        .delete(&t.name, &DeleteParams::default().grace_period(0))
                        .await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Prints `SKIPPED <test>: <why>` past the test harness's output capture, so a skipped test
/// is visible in a plain `cargo test` run instead of passing silently. Under `CI=true` a skip
/// fails the test instead: a CI whose environment lost the apiserver, root or helm must go red,
/// never pass by skipping every test that needs them.
pub fn skipped(test_name: &str, why: &str) {
    use std::io::Write;
    if skips_fail(std::env::var("CI").ok().as_deref()) {
        panic!("SKIPPED {test_name}: {why}; under CI=true a skip is a failure");
    }
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test_name}: {why}");
}

/// Whether the `CI` variable's value makes a skip a failure: `true` or `1`, as CI services set it.
pub fn skips_fail(ci: Option<&str>) -> bool {
    ci.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1"))
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A DNS-1123 name unique across test processes and runs: `<prefix>-<pid>-<n>-<nanos>`.
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() % 100_000)
        .unwrap_or(0);
    format!("{prefix}-{:x}-{n}-{nanos}", std::process::id())
}

/// Polls `check` every 100 ms until it returns true; fails naming `what` after `timeout`.
/// Errors from `check` are remembered and reported, not fatal (the object may not exist yet).
pub async fn wait_for<F, Fut>(
    timeout: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    let mut last_err = None;
    loop {
        match check().await {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if start.elapsed() >= timeout {
            anyhow::bail!(
                "timed out after {timeout:?} waiting for {what}{}",
                last_err
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts that `check` stays true for the whole of `period` (for "must NOT happen" tests).
pub async fn holds_for<F, Fut>(period: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    while start.elapsed() < period {
        if !check().await? {
            anyhow::bail!("{what} stopped holding after {:?}", start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// A free loopback address for a child's `--admin-addr`.
pub fn free_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local addr")
}

/// A plain HTTP/1.1 GET against a child's admin server: (status code, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    http_get_as(addr, path, None).await
}

/// [`http_get`], with `token` as the bearer token when given.
pub async fn http_get_as(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await??;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await??;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response from {addr}: {out:?}"))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// The status code of `path` on a child's admin server; 0 when it does not answer.
pub async fn status(admin: std::net::SocketAddr, path: &str) -> u16 {
    http_get(admin, path).await.map(|(c, _)| c).unwrap_or(0)
}

/// Waits up to `within` until `/readyz` on a child's admin server answers 200 (a child not
/// listening yet is simply not ready); `what` names the wait when it times out.
pub async fn wait_ready(
    admin: std::net::SocketAddr,
    within: Duration,
    what: &str,
) -> anyhow::Result<Duration> {
    wait_for(within, what, || async {
        Ok(status(admin, "/readyz").await == 200)
    })
    .await
}

/// Polls a child's admin server from `down` until `outage` has passed, while its apiserver is
/// away: `/healthz` must answer 200 at every poll (liveness stays up, no restart storm).
/// Returns how long after `down` `/readyz` first answered 503, if it did.
pub async fn ride_out_outage(
    admin: std::net::SocketAddr,
    down: Instant,
    outage: Duration,
) -> Option<Duration> {
    let mut first_503 = None;
    while down.elapsed() < outage {
        assert_eq!(
            status(admin, "/healthz").await,
            200,
            "liveness during outage"
        );
        if first_503.is_none() && status(admin, "/readyz").await == 503 {
            first_503 = Some(down.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    first_503
}

/// The value of an unlabelled metric in a child's `/metrics`, if exported.
pub async fn metric(addr: std::net::SocketAddr, name: &str) -> anyhow::Result<Option<f64>> {
    let (_, body) = http_get(addr, "/metrics").await?;
    Ok(body.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    }))
}

/// A minimal pod in `namespace` bound to `node` (no kubelet runs it: it stays Pending).
pub fn bound_pod(namespace: &str, name: &str, node: &str) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
    Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                image: Some("registry.invalid/none".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A pod security context setting each of `names` to `1`: what the sysctl tests and benches
/// put in a pod.
pub fn sysctls(names: &[&str]) -> k8s_openapi::api::core::v1::PodSecurityContext {
    use k8s_openapi::api::core::v1::{PodSecurityContext, Sysctl};
    PodSecurityContext {
        sysctls: Some(
            names
                .iter()
                .map(|n| Sysctl {
                    name: n.to_string(),
                    value: "1".into(),
                })
                .collect(),
        ),
        ..Default::default()
    }
}
