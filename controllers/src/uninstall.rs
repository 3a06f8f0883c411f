//! `controller-manager uninstall`: what `helm uninstall` runs (the chart's post-delete hook Job)
//! once the replicas are going, so that nothing of ours is left that blocks anyone:
//!
//! 1. it waits until no replica holds the Lease (released on SIGTERM, or expired), so that no
//!    leader re-adds what it removes, then deletes the Lease;
//! 2. it takes our finalizer off every ServiceCIDR that is not being deleted (nothing is lost:
//!    kube-controller-manager's controller, when turned back on, adds it again);
//! 3. a ServiceCIDR already being deleted keeps the finalizer while an IPAddress would be
//!    orphaned, since removing it then is the very orphaning it exists to prevent; it is listed
//!    with its blockers instead. One that nothing blocks loses it once the 10 s grace is over,
//!    as the controller would have done.
//!
//! `--dry-run` prints what it would do and changes nothing. Exit 0 when done (blocked
//! ServiceCIDRs listed), 2 on errors.

use std::time::Duration;

use clap::Args;
use jiff::Timestamp;
use k8s_openapi::api::{coordination::v1::Lease, networking::v1::ServiceCIDR};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;

use crate::servicecidr::{self, blockers, decide::FINALIZER};

#[derive(Args, Debug, Clone)]
pub struct UninstallArgs {
    /// The namespace of the leader-election Lease (the release's).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: String,
    /// The Lease's name.
    #[arg(long, default_value = "groundskeeper-controller-manager")]
    pub lease_name: String,
    /// How long to wait for the last leader to let go of the Lease.
    #[arg(long, default_value = "60s", value_parser = groundskeeper_plumbing::client::parse_duration)]
    pub lease_wait: Duration,
}

/// The deletion grace of a ServiceCIDR (upstream's deletionGracePeriod).
const GRACE: Duration = Duration::from_secs(10);

pub async fn run(client: Client, args: &UninstallArgs, dry_run: bool) -> u8 {
    match uninstall(client, args, dry_run).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("uninstall: {e:#}");
            2
        }
    }
}

async fn uninstall(client: Client, args: &UninstallArgs, dry_run: bool) -> anyhow::Result<()> {
    let leases = Api::<Lease>::namespaced(client.clone(), &args.lease_namespace);
    wait_lease_free(&leases, &args.lease_name, args.lease_wait).await?;
    if dry_run {
        println!(
            "dry-run: would delete Lease {}/{}",
            args.lease_namespace, args.lease_name
        );
    } else {
        match leases
            .delete(&args.lease_name, &DeleteParams::default())
            .await
        {
            Ok(_) => println!("deleted Lease {}/{}", args.lease_namespace, args.lease_name),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }

    let cidrs = Api::<ServiceCIDR>::all(client.clone());
    for c in cidrs.list(&ListParams::default()).await? {
        let name = c.name_any();
        if !c.finalizers().iter().any(|f| f == FINALIZER) {
            continue;
        }
        if let Some(deleted) = &c.metadata.deletion_timestamp {
            let (text, blocked) = blockers::report(client.clone(), &name).await?;
            if blocked {
                println!(
                    "kept the finalizer of ServiceCIDR {name}: it is being deleted and IPs would be orphaned"
                );
                print!("{text}");
                continue;
            }
            let since = Timestamp::now().duration_since(deleted.0).unsigned_abs();
            if let Some(left) = GRACE.checked_sub(since) {
                tokio::time::sleep(left).await;
            }
        }
        if dry_run {
            println!("dry-run: would remove the finalizer {FINALIZER} from ServiceCIDR {name}");
            continue;
        }
        let body = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}});
        let params = PatchParams {
            field_manager: Some(servicecidr::conflict::FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        match cidrs.patch(&name, &params, &Patch::Strategic(body)).await {
            Ok(_) => println!("removed the finalizer {FINALIZER} from ServiceCIDR {name}"),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Until no live holder: the holder gone, or its renewal older than the lease duration.
async fn wait_lease_free(leases: &Api<Lease>, name: &str, wait: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let Some(lease) = leases.get_opt(name).await? else {
            return Ok(());
        };
        let spec = lease.spec.unwrap_or_default();
        let holder = spec.holder_identity.unwrap_or_default();
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(0) as u64);
        let expired = spec
            .renew_time
            .is_none_or(|t| Timestamp::now().duration_since(t.0).unsigned_abs() > duration);
        if holder.is_empty() || expired {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "Lease {name} is still held by {holder} after {wait:?}: a replica still runs (uninstall the release first)"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
