//! The takeover row: a leader dies, and a standby on the same Lease takes over; the time from
//! the death to the new leader's first delete, ours (a standby whose caches are warm) beside
//! kube-controller-manager's (whose standby lists only once it leads).
//!
//! The bench plays the leader that dies, for both: it holds the Lease, renews it every 2 s as
//! a leader with the default retry period does, and stops renewing just after a renewal was
//! answered (the worst moment to die: a standby waits the whole lease duration from there).
//! A standby sees no difference from a killed process: in both cases the renewals stop. It
//! keeps one kube-controller-manager in memory at a time, where a real leader would be a second.
//!
//! The two finished pods of the start row wait in the row's namespace before the standby
//! starts; the standby runs with `--terminated-pod-gc-threshold=1`, so its first cycle as a
//! leader deletes the older one. The goal: the lease duration plus 2 s.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use testkit::figures::bench as figure;
use testkit::wait_ready;

use crate::process::{Run, kcm_bin};
use crate::start::{self, FirstPods};

/// The dead leader's name in the Lease.
const DEAD: &str = "bench-leader-that-dies";
/// Lease duration and retry period: both PodGCs' defaults.
const LEASE_SECONDS: i32 = 15;
const RENEW_EVERY: Duration = Duration::from_secs(2);
/// The goal: the lease duration, plus 2 s for the takeover's first action.
const GOAL_S: f64 = LEASE_SECONDS as f64 + 2.0;

/// The takeover row: see the module doc.
pub(crate) async fn takeover_row(
    cluster: &testkit::Cluster,
    bin: &str,
    size: &str,
) -> anyhow::Result<()> {
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let client = &cluster.client;
    let ns = cluster
        .namespace_for_pods("podgc-takeover", Duration::from_secs(60))
        .await?;

    let ours = {
        let lease = Leader::hold(client, &ns, "groundskeeper-takeover").await?;
        let first = FirstPods::make(client, &ns).await?;
        let started = Instant::now();
        let run = Run::start_standby(
            bin,
            &kubeconfig,
            &ns,
            &lease.name,
            &["--gc-period=5s", start::THRESHOLD_FLAG],
        )?;
        wait_ready(run.admin(), Duration::from_secs(900), "podgc standby ready").await?;
        let warm = started.elapsed();
        // A standby that has been ready a while, as one is when its leader dies.
        tokio::time::sleep(Duration::from_secs(10)).await;
        anyhow::ensure!(
            first.both_there().await?,
            "takeover row: our standby deleted a pod while the bench held the lease"
        );
        let name = lease.name.clone();
        let died = lease.die().await?;
        let took = Took::measure(client, &ns, &name, &first, died).await?;
        drop(run);
        took.print(
            &format!(
                "groundskeeper (standby ready {:.1}s after its start)",
                warm.as_secs_f64()
            ),
            "manager",
            size,
        )?;
        took
    };

    match kcm_bin() {
        Some(kcm) => {
            let lease = Leader::hold(client, &ns, "kcm-takeover").await?;
            let first = FirstPods::make(client, &ns).await?;
            let lock = [
                "--leader-elect=true".to_string(),
                format!("--leader-elect-resource-namespace={ns}"),
                format!("--leader-elect-resource-name={}", lease.name),
                start::THRESHOLD_FLAG.to_string(),
            ];
            let lock: Vec<&str> = lock.iter().map(String::as_str).collect();
            let k = Run::start_kcm(&kcm, &kubeconfig, 20, 30, &lock)?;
            k.bin
                .wait_for_log("to acquire leader lease", Duration::from_secs(120))
                .await?;
            tokio::time::sleep(Duration::from_secs(10)).await;
            anyhow::ensure!(
                first.both_there().await?,
                "takeover row: kube-controller-manager deleted a pod while the bench held the lease"
            );
            let name = lease.name.clone();
            let died = lease.die().await?;
            let took = Took::measure(client, &ns, &name, &first, died).await;
            drop(k);
            let theirs = took?;
            theirs.print("kube-controller-manager", "kcm", size)?;
            figure(
                &format!("takeover_to_first_delete_ratio_to_kcm_{size}"),
                ours.first_delete.as_secs_f64() / theirs.first_delete.as_secs_f64(),
                "ratio",
            );
        }
        None => println!(
            "takeover row: kube-controller-manager SKIPPED (set PODGC_BENCH_KCM, or run `bash e2e/cluster.sh binaries` once)"
        ),
    }
    Ok(())
}

/// The leader the bench plays: it holds `name` in `ns` and renews it until it dies.
struct Leader {
    api: Api<Lease>,
    name: String,
    renewing: tokio::task::JoinHandle<()>,
}

impl Leader {
    async fn hold(client: &Client, ns: &str, name: &str) -> anyhow::Result<Self> {
        let api: Api<Lease> = Api::namespaced(client.clone(), ns);
        let _ = api.delete(name, &Default::default()).await;
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "holderIdentity": DEAD,
                "leaseDurationSeconds": LEASE_SECONDS,
                "acquireTime": micro_now(),
                "renewTime": micro_now(),
                "leaseTransitions": 0,
            }
        }))?;
        api.create(&PostParams::default(), &lease).await?;
        let renewing = tokio::spawn({
            let (api, name) = (api.clone(), name.to_string());
            async move {
                loop {
                    tokio::time::sleep(RENEW_EVERY).await;
                    let _ = renew(&api, &name).await;
                }
            }
        });
        Ok(Self {
            api,
            name: name.to_string(),
            renewing,
        })
    }

    /// Stops renewing, just after one more renewal was answered: the instant of death.
    async fn die(self) -> anyhow::Result<Instant> {
        self.renewing.abort();
        let _ = self.renewing.await;
        renew(&self.api, &self.name).await?;
        Ok(Instant::now())
    }
}

async fn renew(api: &Api<Lease>, name: &str) -> anyhow::Result<()> {
    let patch = json!({"spec": {"holderIdentity": DEAD, "renewTime": micro_now()}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// A MicroTime for now.
fn micro_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string()
}

/// What a takeover took, from the leader's death.
struct Took {
    /// Until the Lease named another holder.
    acquired: Duration,
    /// Until the older finished pod was deleted.
    first_delete: Duration,
}

impl Took {
    async fn measure(
        client: &Client,
        ns: &str,
        lease: &str,
        first: &FirstPods,
        died: Instant,
    ) -> anyhow::Result<Self> {
        let api: Api<Lease> = Api::namespaced(client.clone(), ns);
        let acquired = async {
            loop {
                let holder = api
                    .get(lease)
                    .await?
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default();
                if holder != DEAD {
                    return anyhow::Ok(died.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let within = Duration::from_secs(900);
        let (acquired, deleted) = tokio::join!(
            tokio::time::timeout(within, acquired),
            first.first_delete(died, within)
        );
        let (first_delete, correct) = deleted?;
        anyhow::ensure!(
            correct,
            "takeover row: the new leader deleted the wrong pod first"
        );
        Ok(Self {
            acquired: acquired.map_err(|_| anyhow::anyhow!("no takeover within {within:?}"))??,
            first_delete,
        })
    }

    fn print(&self, who: &str, prefix: &str, size: &str) -> anyhow::Result<()> {
        println!(
            "takeover row: {who}: took the lease {:.1}s after the leader died, first delete {:.1}s after (goal {GOAL_S:.0}s: the lease duration + 2s)",
            self.acquired.as_secs_f64(),
            self.first_delete.as_secs_f64(),
        );
        figure(
            &format!("{prefix}_takeover_to_lease_{size}_s"),
            self.acquired.as_secs_f64(),
            "s",
        );
        figure(
            &format!("{prefix}_takeover_to_first_delete_{size}_s"),
            self.first_delete.as_secs_f64(),
            "s",
        );
        figure(
            &format!("{prefix}_takeover_ratio_to_goal_{size}"),
            self.first_delete.as_secs_f64() / GOAL_S,
            "ratio",
        );
        Ok(())
    }
}
