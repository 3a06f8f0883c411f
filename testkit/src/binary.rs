//! The project's binaries run as child processes against the test cluster, out of cluster,
//! exactly as `make run` runs them.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::process::{Child, Command};

pub struct Binary {
    child: Child,
    log: PathBuf,
}

impl Binary {
    /// Starts `path` (pass `env!("CARGO_BIN_EXE_<name>")`) with `args` and `env`, logging to a
    /// file whose path is printed so a failing test can be debugged. `KUBECONFIG` is the tests'
    /// own (`KUBECONFIG`, or the shared control plane's) unless `env` names another.
    /// The process is killed when the handle is dropped.
    pub fn start(
        path: &str,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join("groundskeeper-tests");
        std::fs::create_dir_all(&dir)?;
        let log = dir.join(format!("{}.log", crate::unique_name(name)));
        let file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(path);
        if let Some(kubeconfig) = crate::default_kubeconfig() {
            cmd.env("KUBECONFIG", kubeconfig);
        }
        let child = cmd
            .args(args)
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {path}: {e}"))?;
        println!("{name}: pid {:?}, log {}", child.id(), log.display());
        Ok(Self { child, log })
    }

    /// node-agent's conntrack task alone on the network namespace `netns` (`--conntrack-netns`),
    /// ready and past its first pass: how every conntrack cluster test starts the agent.
    pub async fn conntrack_agent(
        path: &str,
        name: &str,
        netns: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        Ok(Self::conntrack_agent_with_admin(path, name, netns, extra)
            .await?
            .0)
    }

    /// [`Binary::conntrack_agent`], with the address of its admin server (for `/metrics`).
    pub async fn conntrack_agent_with_admin(
        path: &str,
        name: &str,
        netns: &str,
        extra: &[&str],
    ) -> anyhow::Result<(Self, SocketAddr)> {
        let mut args = vec!["--tasks", "conntrack", "--conntrack-netns", netns];
        args.extend_from_slice(extra);
        let (agent, admin) =
            Self::start_with_admin(path, name, &args, &[("NODE_NAME", "conntrack-test-node")])?;
        crate::wait_ready(
            admin,
            std::time::Duration::from_secs(30),
            "node-agent ready",
        )
        .await?;
        agent
            .wait_for_log("conntrack cleanup pass", std::time::Duration::from_secs(10))
            .await?;
        Ok((agent, admin))
    }

    /// [`Binary::start`] with `--admin-addr` on a free loopback port put before `args`;
    /// returns that address too, since the tests read `/readyz` and `/metrics` there.
    pub fn start_with_admin(
        path: &str,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<(Self, SocketAddr)> {
        let admin = crate::free_addr();
        let admin_s = admin.to_string();
        let mut all = vec!["--admin-addr", &admin_s];
        all.extend_from_slice(args);
        Ok((Self::start(path, name, &all, env)?, admin))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        crate::wait_for(
            timeout,
            &format!("log line containing {needle:?} in {}", self.log.display()),
            || async { Ok(self.logs().contains(needle)) },
        )
        .await
        .map(|_| ())
    }

    /// Sends a signal (e.g. `libc::SIGTERM` = 15, `SIGKILL` = 9) through kill(1).
    pub async fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| anyhow::anyhow!("process already exited"))?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .await?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
        Ok(())
    }

    /// Waits for the process to exit and returns its exit code (None when killed by a signal).
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "process did not exit within {timeout:?}; log {}",
                    self.log.display()
                )
            })??;
        Ok(status.code())
    }
}

impl Binary {
    /// Fails when the apiserver refused any of the process's calls (RBAC 403s in its log).
    pub fn assert_no_api_refusals(&self) {
        let logs = self.logs();
        assert!(
            !logs.contains("is forbidden: User"),
            "an API call was refused; log {}:\n{logs}",
            self.log.display()
        );
    }
}
