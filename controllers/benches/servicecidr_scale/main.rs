//! The ServiceCIDR controller at scale on a real apiserver, next to kube-controller-manager's
//! service-cidr-controller on the same objects. Prints figures; asserts nothing about time or
//! memory.
//!
//!   KUBE_APISERVER=/path/to/kube-apiserver cargo bench -p groundskeeper-controllers --bench servicecidr_scale [-- IPS]
//!
//! On a private control plane (dual-stack Service ranges) it creates SERVICECIDR_SCALE_CIDRS
//! (default 1,000) dual-stack ServiceCIDRs, `10.<100+i/256>.<i%256>.0/24` and
//! `fd00:100::<i>:0/112`, plus one parent `10.100.0.0/16,fd00:100::/96` covering the first 256
//! and every IPv6 one. The IPAddresses (IPS, default 100,000) are those of dual-stack Services
//! with explicit clusterIPs (IPS/2 Services, half the IPs in each family, spread evenly over the
//! ServiceCIDRs), each IPAddress with its parentRef to its Service, so the apiserver's own
//! repair loop keeps them (it deletes allocator-managed IPAddresses whose Service does not
//! exist). The first Service is created through the apiserver (it allocates only from Ready
//! ServiceCIDRs, so this controller first marks them Ready, a run not measured); the others and
//! their IPAddresses are written straight into etcd as copies of those three objects
//! (`testkit::seed`; the apiserver creates 19 Services/s here), then, 75 s later (past the
//! repair loop's 60 s grace), the IPAddresses are counted again and the bench fails if any went.
//! SERVICECIDR_SCALE_CREATE=api creates every Service through the apiserver instead;
//! SERVICECIDR_SCALE_SEED_THREADS (4) etcd writers.
//!
//! Then, for this build's `controller-manager --controllers servicecidr` and for upstream
//! `kube-controller-manager --controllers=service-cidr-controller` (v1.36.2;
//! SERVICECIDR_SCALE_KCM or target/e2e/bin/kube-controller-manager; skipped when absent), one
//! after the other on the same objects, each started fresh:
//! - RSS once its caches have listed and it has synced every ServiceCIDR once (steady), and its
//!   peak (VmHWM) at the end of the run;
//! - (a) covered: a ServiceCIDR whose IPs the parent also contains is deleted; the figure is
//!   how long after `deletionTimestamp + 10 s` (the grace, measured from the timestamp the
//!   controller reads) the bench's watch saw it gone;
//! - (b) blocked: a ServiceCIDR holding IPs no other one contains is deleted; the figure is the
//!   time from the DELETE call to the bench's watch seeing Ready=False/Terminating.
//!
//! SERVICECIDR_SCALE_COMPARE=/path/to/controller-manager also runs that binary (an older
//! build) on the same objects, its figures named `compared_…`.
//!
//! For this build it also prints the mean time of one sync from its own metrics
//! (`groundskeeper_servicecidr_reconcile_duration_seconds`, API calls included) over the syncs
//! each deletion caused. Every figure is also printed as `bench <name> <value> <unit>`.
//! Without KUBE_APISERVER it prints one SKIPPED line and exits 0.

mod objects;
mod rows;

use std::time::{Duration, Instant};

use crate::{
    objects::{
        NAMESPACES, PARENT, PARENT_CIDRS, check_seeded, cidr_name, cidrs_of, count, create_all,
        scale_tag, seed_services, service,
    },
    rows::{all_ready, kcm_bin, kcm_row, our_row, ours, print_row},
};
use k8s_openapi::api::{
    core::v1::{Namespace, Service},
    networking::v1::{IPAddress, ServiceCIDR},
};
use kube::{Api, api::PostParams};
use serde_json::json;
use testkit::figures::{bench, env_num};
use testkit::networking::service_cidr;
use testkit::wait_for;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let ips: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let n_cidrs = env_num("SERVICECIDR_SCALE_CIDRS", 1000).clamp(300, 256 * 155);
    let Some((c, cp)) = testkit::private_cluster("servicecidr_scale").await else {
        println!("servicecidr_scale: SKIPPED (KUBE_APISERVER not set)");
        return Ok(());
    };
    let tag = scale_tag(ips);
    // Two IPs (one per family) per Service, spread evenly over the ServiceCIDRs.
    let per_cidr = (ips / 2).div_ceil(n_cidrs);
    anyhow::ensure!(per_cidr <= 250, "{ips} IPs do not fit {n_cidrs} /24s");
    let services: Vec<(usize, usize)> = (0..ips / 2).map(|k| (k % n_cidrs, k / n_cidrs)).collect();
    let client = c.client.clone();
    let cidrs: Api<ServiceCIDR> = Api::all(client.clone());

    let took = create_all("ServiceCIDRs", (0..=n_cidrs).collect(), |i| {
        let cidrs = cidrs.clone();
        async move {
            let o = if i == n_cidrs {
                service_cidr(PARENT, PARENT_CIDRS)
            } else {
                service_cidr(&cidr_name(i), cidrs_of(i))
            };
            cidrs.create(&PostParams::default(), &o).await.map(|_| ())
        }
    })
    .await?;
    println!(
        "created {} ServiceCIDRs ({n_cidrs} and a parent) in {:.1} s",
        n_cidrs + 1,
        took.as_secs_f64()
    );
    // The allocator takes IPs only from Ready ServiceCIDRs: this controller marks them so.
    {
        let t0 = Instant::now();
        let (_bin, _) = ours(
            &c.kubeconfig,
            None,
            &["--kube-api-qps=1000", "--kube-api-burst=2000"],
        )?;
        wait_for(
            Duration::from_secs(600),
            "every ServiceCIDR Ready",
            || async { all_ready(&cidrs, n_cidrs + 1).await },
        )
        .await?;
        println!(
            "every ServiceCIDR Ready after {:.1} s (groundskeeper, QPS 1000; not a figure)",
            t0.elapsed().as_secs_f64()
        );
    }

    let nss: Vec<String> = (0..NAMESPACES).map(|n| format!("scale-{n}")).collect();
    for ns in &nss {
        let api: Api<Namespace> = Api::all(client.clone());
        let o: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        api.create(&PostParams::default(), &o).await?;
    }
    let seeding = std::env::var("SERVICECIDR_SCALE_CREATE").as_deref() != Ok("api");
    let took = if seeding {
        Duration::from_secs_f64(seed_services(&client, &cp, &nss, &services).await?)
    } else {
        create_all("Services", services.clone(), |(i, j)| {
            let client = client.clone();
            let ns = nss[(i + j) % NAMESPACES].clone();
            async move {
                let api: Api<Service> = Api::namespaced(client, &ns);
                api.create(&PostParams::default(), &service(&ns, i, j))
                    .await
                    .map(|_| ())
            }
        })
        .await?
    };
    let n_ips = count(&Api::<IPAddress>::all(client.clone())).await?;
    println!(
        "{} {} dual-stack Services in {:.1} s ({:.0}/s); {n_ips} IPAddresses exist",
        if seeding { "seeded" } else { "created" },
        services.len(),
        took.as_secs_f64(),
        services.len() as f64 / took.as_secs_f64()
    );
    bench(
        &format!("servicecidr_create_{tag}"),
        took.as_secs_f64(),
        "s",
    );
    if seeding {
        check_seeded(&client, n_ips).await?;
    }
    // The ServiceCIDRs each row deletes: covered ones lie in the parent's /16, blocked ones
    // outside it.
    let pair = |row: usize| (cidr_name(5 + row), cidr_name(n_cidrs - 1 - row));
    let (covered, blocked) = pair(0);
    let r = our_row(&c, None, "", n_cidrs + 1, &covered, &blocked).await?;
    print_row("groundskeeper", "", &tag, &r);
    if let Ok(other) = std::env::var("SERVICECIDR_SCALE_COMPARE") {
        let (covered, blocked) = pair(2);
        let r = our_row(
            &c,
            Some(&other),
            "compared_",
            n_cidrs + 1,
            &covered,
            &blocked,
        )
        .await?;
        print_row(&format!("compared ({other})"), "compared_", &tag, &r);
    }
    let (kcm_covered, kcm_blocked) = pair(1);

    match kcm_bin() {
        None => println!(
            "kube-controller-manager: SKIPPED (no target/e2e/bin/kube-controller-manager: run `bash e2e/cluster.sh binaries` once, or set SERVICECIDR_SCALE_KCM)"
        ),
        Some(bin) => {
            let r = kcm_row(&c, &bin, &kcm_covered, &kcm_blocked).await?;
            print_row("kube-controller-manager v1.36.2", "kcm_", &tag, &r);
        }
    }
    // The objects go with the private control plane.
    drop(c);
    drop(cp);
    Ok(())
}
