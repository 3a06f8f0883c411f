//! `controller-manager uninstall`: what `helm uninstall` runs (the chart's post-delete hook Job)
//! once the replicas are going, so that nothing of ours is left that blocks anyone:
//!
//! 1. it waits until no replica holds the Lease (released on SIGTERM, or expired), so that no
//!    leader re-adds what it removes, then deletes the Lease. Expired is judged as the electors
//!    judge it: the record seen unchanged for a whole lease duration by this process's own
//!    clock, never by comparing `renewTime` (another machine's clock) with ours; the delete is
//!    preconditioned on the resourceVersion judged, so a renewal in between is never deleted;
//! 2. it takes our finalizer off every ServiceCIDR that is not being deleted (nothing is lost:
//!    kube-controller-manager's controller, when turned back on, adds it again);
//! 3. a ServiceCIDR already being deleted keeps the finalizer while an IPAddress would be
//!    orphaned, since removing it then is the very orphaning it exists to prevent; it is listed
//!    with its blockers instead. One that nothing blocks loses it once the 10 s grace is over,
//!    as the controller would have done.
//!
//! 4. it releases every pod still held by the sysctl scheduling gate: once the release is gone
//!    nothing places them and nothing enforces, so they go to the scheduler as they are (each
//!    removal is a JSON patch that first tests the gate is still at the index read, so a pod
//!    changed meanwhile is read again, never loses another gate).
//!
//! `--dry-run` prints what it would do and changes nothing. Exit 0 when done (blocked
//! ServiceCIDRs listed), 2 on errors.

use std::time::Duration;

use clap::Args;
use jiff::Timestamp;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Pod, networking::v1::ServiceCIDR};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions},
};
use serde_json::json;
use tokio::time::Instant;

use crate::leader::{
    decide::{Observation, Step, decide, observe},
    record_of,
};
use crate::servicecidr::{self, blockers, decide::FINALIZER};
use crate::sysctl::facts::GATE;

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
    /// Take our finalizer off the ServiceCIDRs (only where our ServiceCIDR controller ran: with
    /// it off, the finalizer is kube-controller-manager's).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub release_servicecidrs: bool,
    /// Release the pods the sysctl scheduling gate still holds.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub release_gated_pods: bool,
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
    let deadline = Instant::now() + args.lease_wait;
    loop {
        let Some(version) = wait_lease_free(&leases, &args.lease_name, deadline).await? else {
            break;
        };
        if dry_run {
            println!(
                "dry-run: would delete Lease {}/{}",
                args.lease_namespace, args.lease_name
            );
            break;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(version),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match leases.delete(&args.lease_name, &params).await {
            Ok(_) => {
                println!("deleted Lease {}/{}", args.lease_namespace, args.lease_name);
                break;
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => break,
            // Written since it was judged free: a replica renewed or took it; judge again.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }

    if args.release_servicecidrs {
        release_servicecidrs(&client, dry_run).await?;
    }
    if args.release_gated_pods {
        release_gated_pods(&client, dry_run).await?;
    }
    Ok(())
}

/// Every pod not yet bound that carries the gate loses it.
async fn release_gated_pods(client: &Client, dry_run: bool) -> anyhow::Result<()> {
    let all = Api::<Pod>::all(client.clone());
    let unbound = ListParams::default().fields("spec.nodeName=");
    for attempt in 0..3 {
        let mut changed = false;
        for pod in all.list(&unbound).await? {
            let Some(at) = pod
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .and_then(|g| g.iter().position(|g| g.name == GATE))
            else {
                continue;
            };
            let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
            if dry_run {
                println!("dry-run: would remove the scheduling gate {GATE} from pod {ns}/{name}");
                continue;
            }
            let patch = json!([
                {"op": "test", "path": format!("/spec/schedulingGates/{at}/name"), "value": GATE},
                {"op": "remove", "path": format!("/spec/schedulingGates/{at}")},
            ]);
            // kube's typed JSON patch needs the json-patch crate; the body is plain JSON anyway.
            let req = http::Request::patch(format!("/api/v1/namespaces/{ns}/pods/{name}"))
                .header(http::header::CONTENT_TYPE, "application/json-patch+json")
                .body(serde_json::to_vec(&patch)?)?;
            match client.request::<serde_json::Value>(req).await {
                Ok(_) => println!("removed the scheduling gate {GATE} from pod {ns}/{name}"),
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                // The gates changed since the list (the test op failed): read again.
                Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 => changed = true,
                Err(e) => return Err(e.into()),
            }
        }
        if !changed {
            return Ok(());
        }
        anyhow::ensure!(
            attempt < 2,
            "pods kept changing while their gates were removed"
        );
    }
    Ok(())
}

async fn release_servicecidrs(client: &Client, dry_run: bool) -> anyhow::Result<()> {
    let cidrs = Api::<ServiceCIDR>::all(client.clone());
    for c in cidrs.list(&ListParams::default()).await? {
        let name = c.name_any();
        if let Some(deleted) = &c.metadata.deletion_timestamp {
            let since = Timestamp::now().duration_since(deleted.0).unsigned_abs();
            if let Some(left) = GRACE.checked_sub(since) {
                tokio::time::sleep(left).await;
            }
        }
        release_finalizer(&cidrs, client.clone(), &name, dry_run).await?;
    }
    Ok(())
}

/// How often one ServiceCIDR's finalizer removal is judged again after a 409 (the object
/// changed between the read and the write) before the hook gives up with an error.
const REMOVAL_ATTEMPTS: usize = 5;

/// Takes our finalizer off ServiceCIDR `name` unless it is being deleted and IPs would be
/// orphaned. The removal is conditional on the resourceVersion read right before the
/// judgment: an object that changed since answers 409 and is read and judged again.
async fn release_finalizer(
    cidrs: &Api<ServiceCIDR>,
    client: Client,
    name: &str,
    dry_run: bool,
) -> anyhow::Result<()> {
    for _ in 0..REMOVAL_ATTEMPTS {
        let Some(c) = cidrs.get_opt(name).await? else {
            return Ok(());
        };
        if !c.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        if c.metadata.deletion_timestamp.is_some() {
            let (text, blocked) = blockers::report(client.clone(), name).await?;
            if blocked {
                println!(
                    "kept the finalizer of ServiceCIDR {name}: it is being deleted and IPs would be orphaned"
                );
                print!("{text}");
                return Ok(());
            }
        }
        if dry_run {
            println!("dry-run: would remove the finalizer {FINALIZER} from ServiceCIDR {name}");
            return Ok(());
        }
        let Some(rv) = c.resource_version().filter(|v| !v.is_empty()) else {
            anyhow::bail!(
                "ServiceCIDR {name} was read without a resourceVersion: its finalizer can not be removed conditionally"
            );
        };
        let params = PatchParams {
            field_manager: Some(servicecidr::conflict::FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let body = Patch::Strategic(servicecidr::apply::removal_body(&rv));
        match cidrs.patch(name, &params, &body).await {
            Ok(_) => {
                println!("removed the finalizer {FINALIZER} from ServiceCIDR {name}");
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
            // Changed since it was read: read and judge it again.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!(
        "ServiceCIDR {name} changed under each of {REMOVAL_ATTEMPTS} attempts to remove the finalizer; run the uninstall again"
    )
}

/// The identity the hook judges the Lease as: never a replica's (theirs are `POD_NAME_…`).
const JUDGE: &str = "groundskeeper-uninstall";

/// Until no live holder: the Lease gone (`None`), or released or expired (the resourceVersion
/// judged so). Expired means what it means to the electors (`leader::decide`): this process saw
/// the record unchanged for a whole lease duration. `renewTime` is only compared for change,
/// so a holder whose clock is hours off is as live as any while it renews, and one that stopped
/// renewing is expired one lease duration after the hook first saw it, whatever it wrote.
async fn wait_lease_free(
    leases: &Api<Lease>,
    name: &str,
    deadline: Instant,
) -> anyhow::Result<Option<String>> {
    let mut seen: Option<Observation> = None;
    loop {
        let Some(lease) = leases.get_opt(name).await? else {
            return Ok(None);
        };
        let now = Instant::now();
        let observed = observe(seen.take(), record_of(&lease), now);
        match decide(JUDGE, Some(&observed), now) {
            Step::Acquire => return Ok(Some(lease.resource_version().unwrap_or_default())),
            step => {
                let holder = &observed.record.holder;
                anyhow::ensure!(
                    now < deadline,
                    "Lease {name} is still held by {holder}: it was renewed within the last \
                     lease duration, so a replica still runs (uninstall the release first)"
                );
                let next = match step {
                    Step::Follow { expires_in, .. } => expires_in.min(POLL),
                    _ => POLL,
                };
                tokio::time::sleep(next).await;
            }
        }
        seen = Some(observed);
    }
}

/// How often the Lease is read while a holder may still renew it.
const POLL: Duration = Duration::from_millis(500);
