//! The admin HTTP server: `/healthz` (the process serves), `/readyz` (every watch has listed
//! and none has been failing for longer than `--watch-stale-after`), `/metrics` (Prometheus
//! text; open, or only to authorized callers with `--metrics-auth=kubernetes`). Plain HTTP or
//! HTTPS (`--admin-scheme`), within the limits of a `serving` server either way.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
};
use clap::Args;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use rustls::ServerConfig;
use tokio_util::sync::CancellationToken;

use crate::{
    Readiness, metrics,
    metrics_auth::{Delegated, MetricsAuth},
    serving::{self, Counters, Limits, self_signed::Source},
};

#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Admin server (/healthz, /readyz, /metrics)")]
pub struct AdminArgs {
    /// Address of the admin HTTP server (/healthz, /readyz, /metrics).
    #[arg(long, env = "GROUNDSKEEPER_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,

    /// `https` serves the admin server over TLS (as kube-controller-manager's --secure-port):
    /// with --admin-tls-cert-file and --admin-tls-private-key-file, or else a self-signed
    /// certificate made in memory at start. kubelet's HTTPS probes do not verify it.
    #[arg(long, env = "GROUNDSKEEPER_ADMIN_SCHEME", value_enum, default_value_t = Scheme::Http)]
    pub admin_scheme: Scheme,

    /// PEM certificate chain served with --admin-scheme=https, read again every minute (a
    /// renewed Secret or cert-manager certificate is served without a restart).
    #[arg(
        long,
        env = "GROUNDSKEEPER_ADMIN_TLS_CERT_FILE",
        requires = "admin_tls_private_key_file"
    )]
    pub admin_tls_cert_file: Option<PathBuf>,

    /// The private key of --admin-tls-cert-file (PEM).
    #[arg(
        long,
        env = "GROUNDSKEEPER_ADMIN_TLS_PRIVATE_KEY_FILE",
        requires = "admin_tls_cert_file"
    )]
    pub admin_tls_private_key_file: Option<PathBuf>,

    /// Who may read /metrics: `none` (anyone who reaches the port), or `kubernetes` (a bearer
    /// token the apiserver authenticates, whose user may `get` the non-resource URL /metrics:
    /// TokenReview and SubjectAccessReview, which this process's credentials must be allowed
    /// to create). /healthz and /readyz stay open for kubelet's probes.
    #[arg(long, env = "GROUNDSKEEPER_METRICS_AUTH", value_enum, default_value_t = MetricsAuth::None)]
    pub metrics_auth: MetricsAuth,
}

/// `--admin-scheme`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scheme {
    Http,
    Https,
}

impl AdminArgs {
    /// Where the certificate comes from with `--admin-scheme=https`; None for plain HTTP. A
    /// certificate file given with `http` is refused: it would not be served.
    pub fn certificate_source(&self) -> Result<Option<Source>, String> {
        match (
            self.admin_scheme,
            &self.admin_tls_cert_file,
            &self.admin_tls_private_key_file,
        ) {
            (Scheme::Http, None, None) => Ok(None),
            (Scheme::Http, _, _) => Err(
                "--admin-tls-cert-file and --admin-tls-private-key-file need --admin-scheme=https"
                    .into(),
            ),
            (Scheme::Https, Some(cert), Some(key)) => Ok(Some(Source::Files {
                cert: cert.clone(),
                key: key.clone(),
            })),
            (Scheme::Https, _, _) => Ok(Some(Source::SelfSigned {
                hosts: self_signed_hosts(),
            })),
        }
    }
}

/// The names a self-signed admin certificate carries: the host's name (a pod's name) and
/// the loopback names. Scrapers of a self-signed endpoint do not verify it (kube-prometheus
/// scrapes kube-controller-manager so); the names serve whoever pins it.
fn self_signed_hosts() -> Vec<String> {
    let mut hosts = Vec::new();
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() && h != "localhost" {
            hosts.push(h.to_string());
        }
    }
    hosts.extend(["localhost", "127.0.0.1", "::1"].map(String::from));
    hosts
}

/// What one caller can cost the admin server. It answers GETs of small pages to a few
/// scrapers and kubelet's probes: few connections, no bodies, and a check of the caller with
/// the apiserver at most (`--metrics-auth=kubernetes`) within the answer's time. kubelet's
/// probes open a connection each, from the node's address: a source holding none, which
/// always finds room (`serving/sources.rs`), and their endpoints take no lane ([`bind`]).
pub fn limits() -> Limits {
    Limits {
        name: "admin server",
        connections: 64,
        source_connections: 16,
        handshakes: 32,
        source_handshakes: 8,
        handshake_timeout: Duration::from_secs(1),
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(5),
        body_grace: Duration::from_secs(1),
        body_min_rate: 16 << 10,
        slow_bodies: 2,
        answer_timeout: Duration::from_secs(20),
        max_body: 16 << 10,
        small_body: 16 << 10,
        small_in_flight: 16,
        source_in_flight: 8,
        large_in_flight: 1,
        large_answering: 1,
        queue_wait: Duration::from_secs(1),
    }
}

#[derive(Clone)]
struct AdminState {
    registry: Registry,
    auth: Option<Delegated>,
}

pub fn router(registry: Registry, readiness: Readiness) -> Router {
    router_with(registry, readiness, None)
}

/// [`router`], with `/metrics` only for the callers `auth` lets through.
pub fn router_with(registry: Registry, readiness: Readiness, auth: Option<Delegated>) -> Router {
    probes(readiness).merge(metrics_router(registry, auth))
}

/// kubelet's endpoints: answered from memory at once, with no body read.
fn probes(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

fn metrics_router(registry: Registry, auth: Option<Delegated>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(AdminState { registry, auth })
}

async fn readyz(State(readiness): State<Readiness>) -> impl IntoResponse {
    let not_ready = readiness.not_ready();
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

async fn metrics_handler(State(s): State<AdminState>, headers: HeaderMap) -> Response {
    if let Some(auth) = &s.auth
        && let Err(refusal) = auth.check(&headers).await
    {
        return refusal.into_response();
    }
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&s.registry),
    )
        .into_response()
}

/// Binds the admin address now (so a port clash fails start-up, not later) and returns the
/// task that serves until `token` is cancelled: over TLS with `tls`, within [`limits`], its
/// refusals counted in `registry`.
pub async fn bind(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
    auth: Option<Delegated>,
    tls: Option<Arc<ServerConfig>>,
    token: CancellationToken,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let counters = counters(&registry).map_err(std::io::Error::other)?;
    let limits = limits();
    // The probes' endpoints take no lane: answered from memory, they never wait behind the
    // requests in flight (a scrape waiting on a TokenReview); the connection limits, and the
    // header deadline, hold for them as for every request.
    let app = probes(readiness).merge(serving::limited(
        metrics_router(registry, auth),
        &limits,
        counters.clone(),
    ));
    let (local, serve) =
        serving::bind(addr, "--admin-addr", tls, app, limits, counters, token).await?;
    Ok((local, async move {
        serve.await;
        Ok(())
    }))
}

fn counters(registry: &Registry) -> prometheus::Result<Counters> {
    let refused = metrics::registered(
        registry,
        IntCounterVec::new(
            Opts::new(
                "groundskeeper_admin_refused_total",
                "Requests and connections the admin server (/metrics, /healthz, /readyz) refused or cut, by reason: \
                 body_too_large, busy (too many in flight: 429), source_busy (too many from the caller's address: 429), \
                 body_timeout, body_too_slow, answer_timeout, header_timeout, handshake_timeout, connections, \
                 source_connections, handshakes, source_handshakes (a connection closed at once at that cap), \
                 replaced (an idle or silent connection closed to make room for a new one).",
            ),
            &["reason"],
        ),
    )?;
    for r in serving::REFUSED_REASONS {
        refused.with_label_values(&[r]);
    }
    let connections = metrics::registered(
        registry,
        IntGauge::new(
            "groundskeeper_admin_connections",
            "Connections open to the admin server.",
        ),
    )?;
    Ok(Counters {
        refused,
        connections,
    })
}
