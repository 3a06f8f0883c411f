//! `node-agent sysctl check`: the admission decision for the pods in a manifest, offline.

use std::io::Read;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, Sysctl};
use serde::Deserialize;

use super::allowlist::{Admission, Allowlist};
use super::kernel::KernelVersion;
use super::kubelet::Kubelet;

#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// Kernel release of the node to check against (e.g. 5.4.0, 6.1.0-18-amd64); it decides
    /// which safe sysctls exist. Default: this machine's /proc/sys/kernel/osrelease.
    #[arg(long, value_parser = parse_kernel_version)]
    pub kernel_version: Option<KernelVersion>,

    /// Kubelet version of the node to check against (e.g. v1.38.0, v1.36.2-eks-4d1a2b): its
    /// safe list and namespace table. Known: v1.33 to v1.38; a newer one is checked as v1.38,
    /// an older one as v1.33 (said on stderr). Default: v1.36.
    #[arg(long, value_parser = parse_kubelet_version)]
    pub kubelet_version: Option<String>,

    /// An extra allowed sysctl pattern (name, or prefix ending in *), as in
    /// --allowed-unsafe-sysctls or a SysctlPolicy. Repeat for more.
    #[arg(long = "allow", value_name = "PATTERN", value_parser = parse_pattern)]
    pub allow: Vec<String>,

    /// Manifest to read (multi-document YAML: Pod, Deployment, StatefulSet, DaemonSet,
    /// ReplicaSet, Job, CronJob, List; other kinds are skipped); `-` reads stdin.
    #[arg(short = 'f', long = "filename", default_value = "-")]
    pub file: PathBuf,
}

pub use groundskeeper_sysctl_rules::args::{
    parse_kernel_version, parse_kubelet_version, parse_pattern,
};

/// The exit codes: all admitted, some rejected, input unusable.
pub const EXIT_ADMITTED: u8 = 0;
pub const EXIT_REJECTED: u8 = 1;
pub const EXIT_BAD_INPUT: u8 = 2;

/// The part of a pod spec admission reads; everything else in the manifest is ignored, so a
/// template need not be complete to be checked.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct AdmissionView {
    #[serde(default)]
    host_network: Option<bool>,
    #[serde(default, rename = "hostIPC")]
    host_ipc: Option<bool>,
    #[serde(default)]
    security_context: Option<SecurityView>,
}

#[derive(Deserialize, Default)]
struct SecurityView {
    #[serde(default)]
    sysctls: Option<Vec<Sysctl>>,
}

impl AdmissionView {
    fn into_spec(self) -> PodSpec {
        PodSpec {
            host_network: self.host_network,
            host_ipc: self.host_ipc,
            security_context: self.security_context.map(|s| PodSecurityContext {
                sysctls: s.sysctls,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// One workload found in the manifest.
#[derive(Debug)]
pub struct Found {
    pub label: String,
    pub spec: PodSpec,
}

/// Walks the documents, returning each workload's pod spec or an error naming the document.
pub fn workloads(text: &str) -> Result<Vec<Found>, String> {
    let mut out = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = serde_norway::Value::deserialize(doc)
            .map_err(|e| format!("document {}: not valid YAML: {e}", i + 1))?;
        collect(&value, &format!("document {}", i + 1), &mut out)?;
    }
    Ok(out)
}

fn collect(value: &serde_norway::Value, at: &str, out: &mut Vec<Found>) -> Result<(), String> {
    if value.is_null() {
        return Ok(());
    }
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    let path: &[&str] = match kind {
        "Pod" => &["spec"],
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
            &["spec", "template", "spec"]
        }
        "CronJob" => &["spec", "jobTemplate", "spec", "template", "spec"],
        "List" => {
            let items = value.get("items").and_then(|i| i.as_sequence());
            for (j, item) in items.into_iter().flatten().enumerate() {
                collect(item, &format!("{at} item {}", j + 1), out)?;
            }
            return Ok(());
        }
        _ => return Ok(()),
    };
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name").or_else(|| m.get("generateName")))
        .and_then(|n| n.as_str())
        .unwrap_or("<unnamed>");
    let label = format!("{kind}/{name}");
    let spec_value = path
        .iter()
        .try_fold(value, |v, key| v.get(key))
        .cloned()
        .unwrap_or(serde_norway::Value::Null);
    let view = if spec_value.is_null() {
        AdmissionView::default()
    } else {
        serde_norway::from_value::<AdmissionView>(spec_value)
            .map_err(|e| format!("{at} ({label}): pod spec does not parse: {e}"))?
    };
    out.push(Found {
        label,
        spec: view.into_spec(),
    });
    Ok(())
}

/// One output line per workload, and the exit code.
pub fn report(allowlist: &Allowlist, found: &[Found]) -> (Vec<String>, u8) {
    let mut code = EXIT_ADMITTED;
    let lines = found
        .iter()
        .map(|f| match allowlist.admit(&f.spec) {
            Admission::Admit => format!("{}: admit", f.label),
            Admission::Reject { reason, message } => {
                code = EXIT_REJECTED;
                format!("{}: reject: {reason}: {message}", f.label)
            }
        })
        .collect();
    (lines, code)
}

/// Runs the subcommand; prints to stdout, errors to stderr.
pub fn run(args: CheckArgs) -> u8 {
    match run_inner(args) {
        Ok((lines, code)) => {
            for l in lines {
                println!("{l}");
            }
            code
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

fn run_inner(args: CheckArgs) -> Result<(Vec<String>, u8), String> {
    let kernel = match args.kernel_version {
        Some(k) => k,
        None => KernelVersion::from_host().map_err(|e| format!("{e}; pass --kernel-version"))?,
    };
    let mut text = String::new();
    if args.file.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("reading stdin: {e}"))?;
    } else {
        text = std::fs::read_to_string(&args.file)
            .map_err(|e| format!("reading {}: {e}", args.file.display()))?;
    }
    let kubelet = match &args.kubelet_version {
        Some(v) => {
            let judged = Kubelet::from_reported(Some(v.as_str()));
            if let Some(why) = judged.assumed {
                eprintln!("note: {why}");
            }
            judged.kubelet
        }
        None => Kubelet::DEFAULT,
    };
    let patterns: Vec<String> = kubelet
        .safe_sysctls(Some(&kernel))
        .into_iter()
        .map(String::from)
        .chain(args.allow)
        .collect();
    // As kubelet: a pattern this version does not know as namespaced stops it from starting.
    let allowlist = kubelet
        .allowlist(&patterns)
        .map_err(|e| format!("kubelet {kubelet} would not start: {e}"))?;
    let found = workloads(&text)?;
    Ok(report(&allowlist, &found))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: plain}
spec:
  containers: [{name: c, image: x}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  template:
    spec:
      hostNetwork: true
      securityContext:
        sysctls: [{name: net.ipv4.tcp_syncookies, value: "1"}]
---
apiVersion: v1
kind: Service
metadata: {name: ignored}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  jobTemplate:
    spec:
      template:
        spec:
          securityContext:
            sysctls: [{name: kernel/msgmax, value: "65536"}]
---
apiVersion: v1
kind: List
items:
- kind: Job
  metadata: {name: j}
  spec: {template: {spec: {securityContext: {sysctls: [{name: net.ipv4.tcp_rmem, value: "4096 87380 6291456"}]}}}}
"#;

    #[test]
    fn every_workload_kind_is_checked_in_order() {
        let found = workloads(MANIFEST).unwrap();
        let labels: Vec<&str> = found.iter().map(|f| f.label.as_str()).collect();
        assert_eq!(
            labels,
            ["Pod/plain", "Deployment/web", "CronJob/nightly", "Job/j"]
        );

        let old = Kubelet::DEFAULT
            .allowlist(&Kubelet::DEFAULT.safe_sysctls(Some(&"4.14".parse().unwrap())))
            .unwrap();
        let (lines, code) = report(&old, &found);
        assert_eq!(code, EXIT_REJECTED);
        assert_eq!(
            lines,
            [
                "Pod/plain: admit",
                r#"Deployment/web: reject: SysctlForbidden: forbidden sysctl: "net.ipv4.tcp_syncookies" not allowed with host Net enabled"#,
                r#"CronJob/nightly: reject: SysctlForbidden: forbidden sysctl: "kernel.msgmax" not allowlisted"#,
                r#"Job/j: reject: SysctlForbidden: forbidden sysctl: "net.ipv4.tcp_rmem" not allowlisted"#,
            ]
        );
    }

    /// `--kubelet-version` picks the safe list and the namespace table; garbage is refused by
    /// the flag's parser, an unknown version is checked as the nearest known one.
    #[test]
    fn kubelet_version_decides_the_rules() {
        let pod = workloads(
            "kind: Pod\nmetadata: {name: p}\nspec: {securityContext: {sysctls: \
             [{name: net.ipv4.tcp_notsent_lowat, value: '16384'}]}}\n",
        )
        .unwrap();
        let kernel: KernelVersion = "6.1.0-18-amd64".parse().unwrap();
        let check = |flag: Option<&str>| {
            let k = flag.map_or(Kubelet::DEFAULT, |f| {
                Kubelet::from_reported(Some(f)).kubelet
            });
            let list = k.allowlist(&k.safe_sysctls(Some(&kernel))).unwrap();
            report(&list, &pod).1
        };
        assert_eq!(check(None), EXIT_REJECTED);
        assert_eq!(check(Some("v1.36.2")), EXIT_REJECTED);
        assert_eq!(check(Some("v1.37.0")), EXIT_ADMITTED);
        assert_eq!(check(Some("v1.40.0")), EXIT_ADMITTED);
        assert_eq!(check(Some("v1.30.0")), EXIT_REJECTED);
        assert!(parse_kubelet_version("v1.37.0-gke.1").is_ok());
        let e = parse_kubelet_version("latest").unwrap_err();
        assert!(e.contains(r#""latest""#), "{e}");
        // A UTS pattern: v1.36 refuses it as kubelet does at start-up, v1.37 takes it.
        let allow = ["kernel.domainname".to_string()];
        assert!(Kubelet::DEFAULT.allowlist(&allow).is_err());
        assert!(Kubelet::NEWEST.allowlist(&allow).is_ok());
    }

    #[test]
    fn bad_documents_are_named() {
        let e = workloads("kind: Pod\nmetadata: {name: a}\n---\nkind: [\n").unwrap_err();
        assert!(e.starts_with("document 2: not valid YAML"), "{e}");
        let e =
            workloads("kind: Pod\nmetadata: {name: a}\nspec: {hostNetwork: maybe}\n").unwrap_err();
        assert!(e.contains("document 1 (Pod/a)"), "{e}");
    }
}
