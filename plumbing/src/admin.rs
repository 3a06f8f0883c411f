//! The admin HTTP server: `/healthz` (the process serves), `/readyz` (every watch has listed
//! and none has been failing for longer than `--watch-stale-after`), `/metrics` (Prometheus
//! text).

use std::net::SocketAddr;

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use clap::Args;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::{Readiness, metrics};

#[derive(Args, Clone, Debug)]
pub struct AdminArgs {
    /// Address of the admin HTTP server (/healthz, /readyz, /metrics).
    #[arg(long, env = "ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
}

#[derive(Clone)]
struct AdminState {
    registry: Registry,
    readiness: Readiness,
}

pub fn router(registry: Registry, readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_handler))
        .with_state(AdminState {
            registry,
            readiness,
        })
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    let not_ready = s.readiness.not_ready();
    if not_ready.is_empty() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        let why: Vec<String> = not_ready.iter().map(ToString::to_string).collect();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", why.join("; ")),
        )
    }
}

async fn metrics_handler(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&s.registry),
    )
}

/// Binds the admin address now (so a port clash fails start-up, not later) and returns the
/// task that serves until `token` is cancelled.
pub async fn bind(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
    token: CancellationToken,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("--admin-addr {addr}: cannot listen: {e}"))
    })?;
    let local = listener.local_addr()?;
    let app = router(registry, readiness);
    let serve = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { token.cancelled().await })
            .await
    };
    Ok((local, serve))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn endpoints_answer_and_readyz_follows_watches() {
        let readiness = Readiness::default();
        let flag = readiness.register("pods");
        let token = CancellationToken::new();
        let registry = metrics::registry();
        registry.register(readiness.collector()).unwrap();
        let (addr, serve) = bind(
            "127.0.0.1:0".parse().unwrap(),
            registry,
            readiness,
            token.clone(),
        )
        .await
        .unwrap();
        let server = tokio::spawn(serve);

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503") && r.contains("pods"), "{r}");
        flag.mark_ready();
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        let m = get(addr, "/metrics").await;
        assert!(
            m.contains("groundskeeper_watch_stale_seconds{watch=\"pods\"} 0"),
            "{m}"
        );
        assert!(m.contains("process_resident_memory_bytes"), "{m}");

        token.cancel();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn readyz_fails_on_a_stale_watch_while_healthz_stays_up() {
        let readiness = crate::Readiness::new(crate::WatchSettings {
            stale_after: std::time::Duration::from_millis(50),
            backoff_max: std::time::Duration::from_secs(1),
            ..crate::WatchSettings::default()
        });
        let flag = readiness.register("podgc/nodes");
        flag.mark_ready();
        let token = CancellationToken::new();
        let (addr, serve) = bind(
            "127.0.0.1:0".parse().unwrap(),
            metrics::registry(),
            readiness,
            token.clone(),
        )
        .await
        .unwrap();
        let server = tokio::spawn(serve);
        flag.failed(&"connection refused", std::time::Duration::from_secs(1));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let r = get(addr, "/readyz").await;
        assert!(
            r.starts_with("HTTP/1.1 503") && r.contains("podgc/nodes: not healthy for"),
            "{r}"
        );
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        flag.mark_ready();
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        token.cancel();
        server.await.unwrap().unwrap();
    }
}
