//! The start-up both binaries share: signals, registry, readiness, client, admin server.

use std::net::SocketAddr;

use kube::Client;
use prometheus::Registry;
use tokio::task::JoinHandle;

use crate::{Readiness, Shutdown, admin, client::KubeArgs, metrics};

pub struct Process {
    pub shutdown: Shutdown,
    pub registry: Registry,
    pub readiness: Readiness,
    pub client: Client,
    pub admin_addr: SocketAddr,
    admin_task: JoinHandle<std::io::Result<()>>,
}

impl Process {
    pub async fn start(kube: &KubeArgs, admin_addr: SocketAddr) -> anyhow::Result<Self> {
        let shutdown = Shutdown::new();
        shutdown.cancel_on_signals();
        let registry = metrics::registry();
        let readiness = Readiness::default();
        let client = kube.client().await?;
        let (admin_addr, serve) = admin::bind(
            admin_addr,
            registry.clone(),
            readiness.clone(),
            shutdown.token(),
        )
        .await?;
        Ok(Self {
            shutdown,
            registry,
            readiness,
            client,
            admin_addr,
            admin_task: tokio::spawn(serve),
        })
    }

    /// Stops the admin server (it answers until every task has drained).
    pub async fn finish(self) {
        self.shutdown.trigger();
        match self.admin_task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "admin server ended with an error"),
            Err(e) => tracing::warn!(error = %e, "admin server task failed"),
        }
    }
}
