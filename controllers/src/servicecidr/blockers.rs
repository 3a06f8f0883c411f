//! `controller-manager servicecidr blockers NAME`: what keeps a ServiceCIDR from going.
//!
//! Every IPAddress that keeps the ServiceCIDR from being deleted, and who owns it. The answer
//! comes from the controller's own decision code (`CidrSet::has_parent`, `IpIndex::orphans`)
//! over a fresh list, so it can not disagree with what the controller does; the Warning Event
//! names at most 10, this names them all.

use std::fmt::Write as _;

use clap::Args;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::{Api, Client, ResourceExt, api::ListParams};

use super::cache::{
    LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR, index_cidr, ip_address_facts, spec_cidrs,
};
use super::index::{Blocker, CidrSet, IpIndex};

#[derive(Args, Debug, Clone)]
pub struct BlockersArgs {
    /// The ServiceCIDR's name.
    pub name: String,
    /// Exit 1 when something blocks (as `git diff --exit-code`), for scripts; without it a
    /// successful report exits 0 whatever it says.
    #[arg(long)]
    pub exit_code: bool,
}

/// What keeps (or would keep) the ServiceCIDR's deletion waiting.
#[derive(Debug, PartialEq, Eq)]
pub enum Blocking {
    /// Another ServiceCIDR covers every one of its CIDRs: no IP can be orphaned.
    Covered,
    /// No allocator-managed IPAddress lies only inside it.
    Clear,
    /// These IPAddresses lie only inside it, by address.
    Blocked(Vec<Blocker>),
}

/// The controller's decision for `name`, every blocker included. `cidrs` must hold `name`.
pub fn blocking(cidrs: &CidrSet, ips: &IpIndex, name: &str) -> Blocking {
    if cidrs.has_parent(name) {
        return Blocking::Covered;
    }
    let found = ips.orphans(cidrs, name, usize::MAX).found;
    if found.is_empty() {
        Blocking::Clear
    } else {
        Blocking::Blocked(found)
    }
}

/// The report printed for `name`.
pub fn render(name: &str, cidrs: &[String], deleting: bool, v: &Blocking) -> String {
    let mut out = format!("ServiceCIDR {name} ({})", cidrs.join(", "));
    out.push_str(if deleting {
        ", being deleted: "
    } else {
        ", not being deleted (what would block a deletion): "
    });
    match v {
        Blocking::Covered => {
            out.push_str("nothing blocks; another ServiceCIDR covers every CIDR of it\n")
        }
        Blocking::Clear => {
            out.push_str("nothing blocks; no allocated IPAddress lies only inside it\n")
        }
        Blocking::Blocked(found) => {
            let _ = writeln!(
                out,
                "{} IPAddress(es) lie only inside it and block its deletion:",
                found.len()
            );
            for b in found {
                let owner = b
                    .entry
                    .owner
                    .as_ref()
                    .map_or_else(|| "(no parentRef)".to_string(), ToString::to_string);
                let _ = writeln!(out, "  {}\t{}", b.entry.name, owner);
            }
            out.push_str(
                "Delete those objects (usually Services), or create a ServiceCIDR that covers them.\n",
            );
        }
    }
    out
}

/// Lists, decides, prints. Exit code: 0 when the report was made (whatever it says; with
/// `--exit-code`, 1 when something blocks), 2 on errors. A report of blockers is an answer,
/// not a failure: `kubectl exec` users (the chart's NOTES) saw "command terminated with exit
/// code 1" under a correct answer.
pub async fn run(client: Client, args: &BlockersArgs) -> u8 {
    match report(client, &args.name).await {
        Ok((text, blocked)) => {
            print!("{text}");
            u8::from(blocked && args.exit_code)
        }
        Err(e) => {
            eprintln!("servicecidr blockers {}: {e:#}", args.name);
            2
        }
    }
}

/// The report on ServiceCIDR `name` and whether something blocks its deletion.
pub async fn report(client: Client, name: &str) -> anyhow::Result<(String, bool)> {
    let Some(read) = read(client, name).await? else {
        anyhow::bail!("no ServiceCIDR named {name:?}");
    };
    let blocked = matches!(read.blocking, Blocking::Blocked(_));
    Ok((
        render(name, &read.cidrs, read.deleting, &read.blocking),
        blocked,
    ))
}

/// What one fresh list says of ServiceCIDR `name`.
#[derive(Debug)]
pub struct Read {
    /// Its `spec.cidrs`.
    pub cidrs: Vec<String>,
    /// It has a `deletionTimestamp`.
    pub deleting: bool,
    pub blocking: Blocking,
}

/// Lists the ServiceCIDRs and the allocator-managed IPAddresses once and decides for `name`
/// with the controller's code; `None` when there is no such ServiceCIDR. API errors are
/// returned as `kube::Error` inside the `anyhow::Error`, for callers that tell them apart.
pub async fn read(client: Client, name: &str) -> anyhow::Result<Option<Read>> {
    let all = Api::<ServiceCIDR>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let Some(me) = all.items.iter().find(|c| c.name_any() == name) else {
        return Ok(None);
    };
    let mut cidrs = CidrSet::default();
    for c in &all.items {
        index_cidr(&mut cidrs, &c.name_any(), c);
    }
    let selector = format!("{LABEL_MANAGED_BY}={MANAGED_BY_ALLOCATOR}");
    let mut ips = IpIndex::default();
    for ip in Api::<IPAddress>::all(client)
        .list(&ListParams::default().labels(&selector))
        .await?
    {
        if let Some(e) = ip_address_facts(&ip) {
            ips.upsert(e);
        }
    }
    Ok(Some(Read {
        cidrs: spec_cidrs(me),
        deleting: me.metadata.deletion_timestamp.is_some(),
        blocking: blocking(&cidrs, &ips, name),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::index::fixtures::{ips, set};
    use super::*;

    fn names(v: &Blocking) -> Vec<&str> {
        match v {
            Blocking::Blocked(f) => f.iter().map(|b| &*b.entry.name).collect(),
            _ => vec![],
        }
    }

    #[test]
    fn what_blocks() {
        let s = set(&[("x", &["10.0.1.0/24"]), ("y", &["10.0.1.128/25"])]);
        // More than the Event's 10: all are listed.
        let many: Vec<String> = (1..=12).map(|i| format!("10.0.1.{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let v = blocking(&s, &ips(&many), "x");
        assert_eq!(names(&v).len(), 12);
        // Only inside x blocks; also inside y does not; network and broadcast never do.
        let v = blocking(
            &s,
            &ips(&["10.0.1.5", "10.0.1.130", "10.0.1.0", "10.0.1.255"]),
            "x",
        );
        assert_eq!(names(&v), ["10.0.1.5"]);
        assert_eq!(blocking(&s, &ips(&["10.0.1.130"]), "x"), Blocking::Clear);
        let p = set(&[("x", &["10.0.1.0/24"]), ("p", &["10.0.0.0/16"])]);
        assert_eq!(blocking(&p, &ips(&["10.0.1.5"]), "x"), Blocking::Covered);
    }

    #[test]
    fn report_names_each_blocker_and_its_owner() {
        let s = set(&[("x", &["10.0.1.0/24"])]);
        let v = blocking(&s, &ips(&["10.0.1.7"]), "x");
        let text = render("x", &["10.0.1.0/24".into()], true, &v);
        assert!(text.contains("being deleted"), "{text}");
        assert!(text.contains("1 IPAddress(es)"), "{text}");
        assert!(
            text.contains("10.0.1.7\tservices default/svc-10.0.1.7"),
            "{text}"
        );
        let text = render("x", &["10.0.1.0/24".into()], false, &Blocking::Clear);
        assert!(text.contains("nothing blocks"), "{text}");
    }
}
