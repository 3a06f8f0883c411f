//! `control-plane [--node NAME]... [--crd FILE]... -- COMMAND [ARG]...`: starts a throwaway
//! control plane (etcd and the kube-apiserver named by `KUBE_APISERVER`), runs COMMAND with
//! `KUBECONFIG` pointing at it, tears it down and exits with COMMAND's code. `--node` creates a
//! Node object (no kubelet runs it), for the node-agent; `--crd` installs a CRD from its YAML and
//! waits until it is established (the node-agent is not ready before its SysctlPolicy watch
//! lists). Used by `make test` for the chart checks and by `make run` when there is no cluster
//! to run against.

use std::process::{Command, ExitCode};

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use testkit::ControlPlane;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(split) = args.iter().position(|a| a == "--") else {
        eprintln!("usage: control-plane [--node NAME]... [--crd FILE]... -- COMMAND [ARG]...");
        return ExitCode::from(2);
    };
    let (opts, command) = (&args[..split], &args[split + 1..]);
    let mut nodes = Vec::new();
    let mut crds = Vec::new();
    let mut it = opts.iter();
    while let Some(opt) = it.next() {
        match (opt.as_str(), it.next()) {
            ("--node", Some(name)) => nodes.push(name.clone()),
            ("--crd", Some(file)) => crds.push(file.clone()),
            _ => {
                eprintln!("control-plane: unexpected argument {opt:?}");
                return ExitCode::from(2);
            }
        }
    }
    let Some((program, program_args)) = command.split_first() else {
        eprintln!("control-plane: no command after --");
        return ExitCode::from(2);
    };
    let Some((apiserver, etcd)) = ControlPlane::configured() else {
        eprintln!("control-plane: set KUBE_APISERVER to a kube-apiserver binary");
        return ExitCode::from(2);
    };
    let cp = match ControlPlane::start(&apiserver, &etcd) {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("control-plane: {e:#}");
            return ExitCode::from(1);
        }
    };
    eprintln!(
        "control-plane: {} ready (KUBECONFIG={})",
        cp.url(),
        cp.kubeconfig.display()
    );
    if let Err(e) = create_nodes(&cp, &nodes, &crds) {
        eprintln!("control-plane: creating nodes and CRDs: {e:#}");
        return ExitCode::from(1);
    }
    let status = Command::new(program)
        .args(program_args)
        .env("KUBECONFIG", &cp.kubeconfig)
        .spawn()
        .and_then(|mut child| {
            // Ctrl-C reaches the whole process group: let COMMAND drain against a control
            // plane that is still up, and tear down only once it has exited (as system(3)).
            // SAFETY: setting a signal disposition to SIG_IGN has no handler to be unsafe in.
            unsafe {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
            }
            child.wait()
        });
    drop(cp);
    match status {
        Ok(s) => ExitCode::from(s.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("control-plane: running {program}: {e}");
            ExitCode::from(1)
        }
    }
}

fn create_nodes(cp: &ControlPlane, names: &[String], crds: &[String]) -> anyhow::Result<()> {
    if names.is_empty() && crds.is_empty() {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&cp.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let client = kube::Client::try_from(config)?;
        let nodes: Api<Node> = Api::all(client.clone());
        for name in names {
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            nodes.create(&PostParams::default(), &node).await?;
        }
        let api: Api<CustomResourceDefinition> = Api::all(client);
        for file in crds {
            let yaml = std::fs::read_to_string(file)
                .map_err(|e| anyhow::anyhow!("reading the CRD file {file}: {e}"))?;
            let crd: CustomResourceDefinition = serde_norway::from_str(&yaml)
                .map_err(|e| anyhow::anyhow!("{file} is not a CRD: {e}"))?;
            let name = crd.name_any();
            api.create(&PostParams::default(), &crd).await?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let established = api
                    .get(&name)
                    .await?
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                if established {
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the CRD {name} was not established within 30 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    })
}
