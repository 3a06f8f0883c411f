//! The controller-manager's settings `why pod` depends on, read from the cluster: its
//! Deployment's container args and literal env (label
//! `app.kubernetes.io/component=controller-manager`), parsed by the binary's own clap Args
//! (`PodGcArgs`, the sysctl `PolicyArgs`), so a chart value and the plugin can not disagree.
//! A flag given to the plugin overrides; no Deployment readable: the binary's defaults.

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Container};
use kube::{Api, Client, ResourceExt, api::ListParams};
use serde::Serialize;

use super::verdicts::PolicyFlags;
use crate::podgc::PodGcArgs;

pub const SELECTOR: &str = "app.kubernetes.io/component=controller-manager";
const CONTAINER: &str = "controller-manager";

#[derive(Parser, Debug)]
#[command(name = "controller-manager")]
pub struct Deployed {
    #[command(flatten)]
    pub podgc: PodGcArgs,
    #[command(flatten)]
    pub sysctl: PolicyFlags,
}

/// Where the settings came from.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Source {
    /// `namespace/name` of the Deployment read, if one was.
    pub deployment: Option<String>,
    /// Why none was, when none was.
    pub note: Option<String>,
}

/// `args` and literal `env` of a controller-manager container, parsed as the binary parses
/// them: flags of other controllers skipped, the plugin's own environment not read.
pub fn parse(args: &[String], env: &[(String, String)]) -> anyhow::Result<Deployed> {
    let mut cmd = Deployed::command().mut_args(|a| a.env(None));
    // Built: each flag knows whether it takes a value.
    cmd.build();
    let known = |name: &str| {
        cmd.get_arguments().find(|a| {
            a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|al| al.contains(&name))
        })
    };
    let mut kept = vec!["controller-manager".to_string()];
    let mut given = Vec::new();
    let mut words = args.iter().peekable();
    while let Some(w) = words.next() {
        let Some(flag) = w.strip_prefix("--") else {
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, _)) => (n, true),
            None => (flag, false),
        };
        let takes = |a: &clap::Arg| a.get_num_args().is_some_and(|n| n.takes_values());
        match known(name) {
            Some(a) => {
                given.push(a.get_id().to_string());
                kept.push(w.clone());
                if !inline && takes(a) {
                    kept.extend(words.next().cloned());
                }
            }
            // Another controller's flag: its value, if it is a separate word, goes with it.
            None if !inline => {
                words.next_if(|n| !n.starts_with('-'));
            }
            None => {}
        }
    }
    // The Deployment's env, as the binary reads it, for flags not given.
    let original = Deployed::command();
    for a in original.get_arguments() {
        let (Some(var), Some(long)) = (a.get_env(), a.get_long()) else {
            continue;
        };
        if given.iter().any(|g| g == a.get_id().as_str()) {
            continue;
        }
        if let Some((_, v)) = env.iter().find(|(k, _)| var == k.as_str()) {
            kept.push(format!("--{long}={v}"));
        }
    }
    let m: ArgMatches = cmd.try_get_matches_from(kept)?;
    Ok(Deployed::from_arg_matches(&m)?)
}

fn container_of(d: &Deployment) -> Option<&Container> {
    let cs = &d.spec.as_ref()?.template.spec.as_ref()?.containers;
    cs.iter().find(|c| c.name == CONTAINER).or(cs.first())
}

/// The settings of the first controller-manager Deployment the user may list (in `ns`, else
/// in every namespace), or the defaults and why.
pub async fn read(client: &Client, ns: Option<&str>) -> (Deployed, Source) {
    let defaults = || parse(&[], &[]).expect("the defaults parse");
    let api = match ns {
        Some(ns) => Api::<Deployment>::namespaced(client.clone(), ns),
        None => Api::<Deployment>::all(client.clone()),
    };
    let list = api.list(&ListParams::default().labels(SELECTOR)).await;
    let found = match list {
        Ok(l) => l.items,
        Err(e) => {
            let note = format!(
                "the controller-manager's Deployment could not be listed ({e}): its defaults used"
            );
            return (
                defaults(),
                Source {
                    deployment: None,
                    note: Some(note),
                },
            );
        }
    };
    let Some(d) = found.first() else {
        let note =
            format!("no Deployment labelled {SELECTOR}: the controller-manager's defaults used");
        return (
            defaults(),
            Source {
                deployment: None,
                note: Some(note),
            },
        );
    };
    let label = format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any());
    let c = container_of(d);
    let mut args: Vec<String> = c.and_then(|c| c.args.clone()).unwrap_or_default();
    // `command` may carry flags too (after the executable).
    if let Some(cmd) = c.and_then(|c| c.command.as_ref()) {
        args.splice(0..0, cmd.iter().skip(1).cloned());
    }
    let env: Vec<(String, String)> = c
        .and_then(|c| c.env.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect();
    match parse(&args, &env) {
        Ok(p) => {
            let note = (found.len() > 1).then(|| {
                format!(
                    "{} Deployments labelled {SELECTOR}: the first read",
                    found.len()
                )
            });
            (
                p,
                Source {
                    deployment: Some(label),
                    note,
                },
            )
        }
        Err(e) => {
            let note = format!(
                "Deployment {label}: its args do not parse ({e}): the controller-manager's defaults used"
            );
            (
                defaults(),
                Source {
                    deployment: None,
                    note: Some(note),
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_binarys_flags_and_env_others_skipped() {
        let d = parse(
            &s(&[
                "--admin-addr=0.0.0.0:8080",
                "--controllers",
                "podgc",
                "--terminated-pod-gc-threshold=5",
                "--terminated-pod-ttl",
                "1h",
                "--sysctl-default-mode=enforce",
                "--allowed-unsafe-sysctls=net.core.somaxconn",
            ]),
            &[("GROUNDSKEEPER_TERMINATED_POD_TTL".into(), "2h".into())],
        )
        .unwrap();
        assert_eq!(d.podgc.terminated_pod_gc_threshold, 5);
        // The flag wins over the env, as in the binary.
        assert_eq!(
            d.podgc.terminated_pod_ttl,
            std::time::Duration::from_secs(3600)
        );
        assert_eq!(d.sysctl.allowed_unsafe_sysctls(), ["net.core.somaxconn"]);
        assert!(format!("{:?}", d.sysctl.sysctl_default_mode).eq_ignore_ascii_case("enforce"));
        let d = parse(
            &[],
            &[("GROUNDSKEEPER_TERMINATED_POD_TTL".into(), "2h".into())],
        )
        .unwrap();
        assert_eq!(
            d.podgc.terminated_pod_ttl,
            std::time::Duration::from_secs(7200)
        );
        let d = parse(&[], &[]).unwrap();
        assert_eq!(d.podgc.terminated_pod_gc_threshold, 12500);
        assert!(parse(&s(&["--terminated-pod-ttl=soon"]), &[]).is_err());
    }
}
