//! The real kube-scheduler and kube-controller-manager against the test control plane, for tests
//! of what reaches a node: the scheduler binds pods through `pods/binding` exactly as in a
//! cluster (so the admission webhooks on the binding path see what they see in production), and
//! the controller-manager's ReplicaSet controller recreates pods as it does there.
//!
//! A binary is named by its variable (`KUBE_SCHEDULER`, `KUBE_CONTROLLER_MANAGER`), or else
//! found beside `KUBE_APISERVER` (where `e2e/cluster.sh binaries` unpacks all five), or else
//! taken from the Kubernetes node tarball next to `KUBE_APISERVER`
//! (`kubernetes-node-v1.36.2-linux-amd64.tar.xz`, the one the end-to-end node uses), unpacked
//! once with `tar -xJf` into the build's target directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use anyhow::Context as _;

use crate::control_plane::{self, ControlPlane};

/// The tarball beside kube-apiserver that carries the node's binaries.
pub const NODE_TARBALL: &str = "kubernetes-node-v1.36.2-linux-amd64.tar.xz";

/// The binary `name` (`kube-scheduler`, `kube-controller-manager`) the tests may start,
/// unpacking it first if need be; None when neither its variable, nor it or the tarball beside
/// `KUBE_APISERVER`, is there.
pub fn binary(name: &str) -> anyhow::Result<Option<PathBuf>> {
    let var = name.replace('-', "_").to_uppercase();
    if let Some(bin) = std::env::var_os(&var).filter(|v| !v.is_empty()) {
        return Ok(Some(PathBuf::from(bin)));
    }
    let Some((apiserver, _)) = ControlPlane::configured() else {
        return Ok(None);
    };
    // Unpacked already beside it (`e2e/cluster.sh binaries` puts all five in one folder).
    if let Some(beside) = apiserver
        .parent()
        .map(|d| d.join(name))
        .filter(|p| p.is_file())
    {
        return Ok(Some(beside));
    }
    let Some(tarball) = apiserver.parent().map(|d| d.join(NODE_TARBALL)) else {
        return Ok(None);
    };
    if !tarball.is_file() {
        return Ok(None);
    }
    let dir = target_dir().join("kubernetes-node-v1.36.2");
    let bin = dir.join(name);
    if bin.is_file() {
        return Ok(Some(bin));
    }
    // Unpacked beside, then renamed: test binaries running at once never see half a file.
    let staging = dir.join(format!("staging-{}", std::process::id()));
    std::fs::create_dir_all(&staging)?;
    let status = Command::new("tar")
        .arg("-xJf")
        .arg(&tarball)
        .arg("-C")
        .arg(&staging)
        .arg(name)
        .status()
        .context("running tar")?;
    anyhow::ensure!(
        status.success(),
        "tar -xJf {} failed: {status}",
        tarball.display()
    );
    std::fs::rename(staging.join(name), &bin)?;
    let _ = std::fs::remove_dir_all(&staging);
    Ok(Some(bin))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// A running kube-scheduler or kube-controller-manager; killed when dropped (and by the kernel
/// if the test process dies).
pub struct Component {
    child: Child,
    pub log: PathBuf,
}

impl Component {
    /// kube-scheduler `bin` against `cp`, as an admin, without leader election, with `extra`
    /// flags (a bench's `--kube-api-qps`).
    pub fn scheduler(bin: &Path, cp: &ControlPlane, extra: &[&str]) -> anyhow::Result<Self> {
        Self::start(bin, cp, extra)
    }

    /// kube-controller-manager `bin` against `cp`, running only `controllers`
    /// (`replicaset`), as an admin, without leader election.
    pub fn controller_manager(
        bin: &Path,
        cp: &ControlPlane,
        controllers: &str,
    ) -> anyhow::Result<Self> {
        Self::start(bin, cp, &[&format!("--controllers={controllers}")])
    }

    fn start(bin: &Path, cp: &ControlPlane, extra: &[&str]) -> anyhow::Result<Self> {
        let kubeconfig = cp.kubeconfig.display().to_string();
        let port = crate::free_addr().port();
        let name = bin.file_name().unwrap_or_default().to_string_lossy();
        let log = cp
            .dir()
            .join(format!("{name}-{}.log", crate::unique_name("c")));
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--kubeconfig={kubeconfig}"))
            .arg(format!("--authentication-kubeconfig={kubeconfig}"))
            .arg(format!("--authorization-kubeconfig={kubeconfig}"))
            .args(["--bind-address=127.0.0.1", "--leader-elect=false", "-v=1"])
            .arg(format!("--secure-port={port}"))
            .args(extra);
        let child = control_plane::spawn_logged(cmd, &log)?;
        Ok(Self { child, log })
    }

    /// What it logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
