//! The Kubernetes client: in-cluster config or a kubeconfig, timeouts on every call, and the
//! client-side QPS budget.
//!
//! Built here (`mod.rs`) from the layers beside it, each a tower layer on every request:
//! - `ratelimit.rs`: the client-side QPS budget (`--kube-api-qps`/`--kube-api-burst`), and the
//!   token buckets others pace with (the workqueue's, and the refusing `Budget`).
//! - `restclient.rs`: client-go's REST client metrics.
//! - `timeout.rs`: the deadline of every request.

pub mod ratelimit;
pub mod restclient;
pub mod timeout;

use std::{path::PathBuf, time::Duration};

use clap::Args;
use kube::{
    Client, Config,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};

use ratelimit::RateLimitLayer;
use restclient::{RestClientMetricsLayer, host_label};
use timeout::RequestTimeoutLayer;

// Where every flag parser has always found them.
pub use crate::duration::{MAX_DURATION, parse_duration};

#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Kubernetes API client")]
pub struct KubeArgs {
    /// Path to a kubeconfig, or several separated by ':' (merged as kubectl merges them: the
    /// first file to set a value wins; missing files are skipped while one exists). Unset: the
    /// KUBECONFIG environment variable (the same list), else ~/.kube/config, else in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Sustained API requests per second this process may make (<= 0: unlimited). A list's
    /// next pages (`continue=`) ride on its first request's token.
    #[arg(long, env = "GROUNDSKEEPER_KUBE_API_QPS", default_value_t = 20.0, value_parser = parse_qps)]
    pub kube_api_qps: f32,

    /// Requests allowed in a burst above --kube-api-qps.
    #[arg(long, env = "GROUNDSKEEPER_KUBE_API_BURST", default_value_t = 30)]
    pub kube_api_burst: u32,

    /// Deadline of one API request; watches are exempt (the server closes them).
    #[arg(long, env = "GROUNDSKEEPER_KUBE_API_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub kube_api_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("no Kubernetes configuration found (in-cluster or kubeconfig): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("building the Kubernetes client: {0}")]
    Build(#[from] kube::Error),
}

/// Every value [`api_error_label`] returns: the `error` label of the components' error
/// counters for a failed API call (docs/runbook.md lists them).
pub const API_ERROR_LABELS: [&str; 7] = [
    "forbidden",
    "not_found",
    "conflict",
    "too_many_requests",
    "server_error",
    "transport",
    "other",
];

/// The metric label of a failed API call, so that an operator can tell an RBAC gap
/// (`forbidden`) from a lost race (`conflict`: 409, which is also how the apiserver answers a
/// failed UID or resourceVersion precondition) from an overloaded or broken apiserver
/// (`too_many_requests`, `server_error`) from a network or deadline failure (`transport`: no
/// answer at all). The one classification every component uses.
pub fn api_error_label(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) => match s.code {
            403 => "forbidden",
            404 => "not_found",
            409 | 412 => "conflict",
            429 => "too_many_requests",
            500..=599 => "server_error",
            _ => "other",
        },
        // No answer: the connection, TLS, the request deadline (RequestTimeoutLayer fails
        // through the service stack), or the body broke off.
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            "transport"
        }
        _ => "other",
    }
}

impl KubeArgs {
    pub async fn config(&self) -> Result<Config, ClientError> {
        // KUBECONFIG, the variable every Kubernetes client reads, is read as kubectl reads it
        // (a list), not as the flag's env fallback.
        let list = match &self.kubeconfig {
            Some(path) => Some(path.clone().into_os_string()),
            None => std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()),
        };
        let mut config = match list {
            Some(list) => {
                let kc = read_kubeconfigs(&list)?;
                Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                    .await
                    .map_err(|source| ClientError::Kubeconfig {
                        path: list.into(),
                        source,
                    })?
            }
            None => Config::infer().await?,
        };
        config.connect_timeout = Some(Duration::from_secs(10));
        config.write_timeout = Some(self.kube_api_timeout);
        // Watches hold the connection open for up to 290 s (kube-runtime's server-side
        // timeout), so the read timeout must outlast that; plain requests finish long before.
        config.read_timeout = Some(Duration::from_secs(295));
        set_user_agent(&mut config, "");
        Ok(config)
    }

    /// The client every controller shares: one QPS budget for the whole process.
    pub async fn client(&self) -> Result<Client, ClientError> {
        Ok(self.clients().await?.0)
    }

    /// The process's client, and a second one on the same QPS budget (one token bucket) but
    /// without kube's automatic retry of 429/503/504: for a caller that must see each 429 to
    /// adapt its own concurrency (PodGC's deletes).
    pub async fn clients(&self) -> Result<(Client, Client), ClientError> {
        let config = self.config().await?;
        let limit = RateLimitLayer::new(self.kube_api_qps, self.kube_api_burst);
        let mut unretried = config.clone();
        unretried.default_retry = false;
        Ok((
            self.build(config, limit.clone())?,
            self.build(unretried, limit)?,
        ))
    }

    /// The leader elector's own client: its own connections and no token bucket. A renewal
    /// must never wait behind the controllers' requests (a large `--gc-concurrency`, a low
    /// `--kube-api-qps`): a leader that misses renewals because it is busy deleting pods stops
    /// leading. The elector makes about one read and one write per retry period, so it needs
    /// no budget of its own.
    pub async fn lease_client(&self) -> Result<Client, ClientError> {
        self.own_client("leader-election").await
    }

    /// A client with connections of its own and outside the process's token bucket, named
    /// `what` in its user agent: for calls that a caller outside the process causes (the
    /// webhook's pod lookups, the admin server's TokenReviews), which must neither spend the
    /// controllers' budget nor wait behind it. Its caller bounds it with a
    /// [`Budget`](crate::client::ratelimit::Budget) of its own.
    pub async fn own_client(&self, what: &str) -> Result<Client, ClientError> {
        let mut config = self.config().await?;
        set_user_agent(&mut config, what);
        tracing::info!(server = %config.cluster_url, client = what, "API client of its own");
        self.build(config, None)
    }

    fn build(&self, config: Config, limit: Option<RateLimitLayer>) -> Result<Client, ClientError> {
        // The deadline sits inside the rate limiter: time spent waiting for a token is not a hang.
        // client-go's request metrics sit inside both: they time the apiserver, not the budget,
        // and a request the deadline abandons is counted as a failed one.
        let counted = RestClientMetricsLayer::for_url(&config.cluster_url);
        let limit = limit.map(|l| l.for_host(host_label(&config.cluster_url)));
        let builder = ClientBuilder::try_from(config)?
            .with_layer(&counted)
            .with_layer(&RequestTimeoutLayer(self.kube_api_timeout));
        Ok(match limit {
            Some(layer) => builder.with_layer(&layer).build(),
            None => builder.build(),
        })
    }
}

/// This machine's (or pod's) host name: `HOSTNAME`, else the kernel's.
pub fn host_name() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|h| !h.is_empty())
}

/// `<binary>/<version> (<POD_NAME or host>[; <what>])`: the apiserver's audit log then says
/// which replica, and which of its clients, made a request.
/// The kubeconfig files of a ':'-separated list merged by kubectl's rules (kube's
/// `Kubeconfig::merge`: the first file to set a value wins). As in client-go, a missing file is
/// skipped; none existing is an error naming them all, and an unreadable one names itself.
fn read_kubeconfigs(list: &std::ffi::OsStr) -> Result<Kubeconfig, ClientError> {
    let paths: Vec<PathBuf> = std::env::split_paths(list)
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    let present: Vec<&PathBuf> = paths.iter().filter(|p| p.exists()).collect();
    let Some(first) = present.first() else {
        let path = PathBuf::from(list);
        let source = kube::config::KubeconfigError::ReadConfig(
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            path.clone(),
        );
        return Err(ClientError::Kubeconfig { path, source });
    };
    let read = |p: &PathBuf| {
        Kubeconfig::read_from(p).map_err(|source| ClientError::Kubeconfig {
            path: p.clone(),
            source,
        })
    };
    let mut merged = read(first)?;
    for p in &present[1..] {
        merged = merged
            .merge(read(p)?)
            .map_err(|source| ClientError::Kubeconfig {
                path: (*p).clone(),
                source,
            })?;
    }
    Ok(merged)
}

fn set_user_agent(config: &mut Config, what: &str) {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "groundskeeper".into());
    let instance = crate::events::pod_name()
        .or_else(host_name)
        .unwrap_or_default();
    let what = if what.is_empty() {
        String::new()
    } else {
        format!("; {what}")
    };
    let agent = format!("{binary}/{} ({instance}{what})", env!("CARGO_PKG_VERSION"));
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    if let Ok(value) = http::HeaderValue::from_str(&agent) {
        config.headers.push((http::header::USER_AGENT, value));
    }
}

/// Parses a requests-per-second budget: a finite number; 0 or less means unlimited, and a
/// positive budget below one request in 1000 s is refused (its waits would overflow timers).
pub fn parse_qps(s: &str) -> Result<f32, String> {
    let q: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of requests per second"))?;
    if !q.is_finite() {
        return Err(format!(
            "{s:?} is not a finite number (use 0 for unlimited)"
        ));
    }
    if q > 0.0 && q < 0.001 {
        return Err(format!("{s:?} is below 0.001 (use 0 for unlimited)"));
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qps() {
        assert_eq!(parse_qps("20"), Ok(20.0));
        assert_eq!(parse_qps("0"), Ok(0.0));
        assert_eq!(parse_qps("-1"), Ok(-1.0));
        for bad in ["NaN", "inf", "-inf", "1e-30", "lots", "1e39"] {
            let e = parse_qps(bad).unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    /// A local HTTP endpoint answering every request with a version document.
    async fn version_server() -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = r#"{"major":"1","minor":"36","gitVersion":"v1.36.2","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        addr
    }

    /// With the shared budget used up (queued calls waiting seconds for tokens), a lease call
    /// still goes out at once.
    #[tokio::test]
    async fn lease_calls_do_not_queue_behind_the_shared_budget() {
        let addr = version_server().await;
        let args = KubeArgs {
            kubeconfig: None,
            kube_api_qps: 2.0,
            kube_api_burst: 1,
            kube_api_timeout: Duration::from_secs(30),
        };
        let config = || Config::new(format!("http://{addr}").parse().unwrap());
        let shared = args
            .build(
                config(),
                RateLimitLayer::new(args.kube_api_qps, args.kube_api_burst),
            )
            .unwrap();
        let lease = args.build(config(), None).unwrap();
        // Burst spent, then four more queued: the last waits two seconds for its token.
        shared.apiserver_version().await.unwrap();
        let start = std::time::Instant::now();
        let queued: Vec<_> = (0..4)
            .map(|_| {
                let c = shared.clone();
                tokio::spawn(async move { c.apiserver_version().await.map(|_| start.elapsed()) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t = std::time::Instant::now();
        lease.apiserver_version().await.unwrap();
        let lease_took = t.elapsed();
        let mut slowest = Duration::ZERO;
        for q in queued {
            slowest = slowest.max(q.await.unwrap().unwrap());
        }
        assert!(
            slowest >= Duration::from_millis(1800),
            "the shared budget was exhausted: {slowest:?}"
        );
        assert!(
            lease_took < Duration::from_millis(500),
            "the lease call waited {lease_took:?}"
        );
    }

    /// Every client the flags build counts its requests in client-go's metrics, under the
    /// apiserver's host:port: the shared client and a client of its own alike.
    #[tokio::test]
    async fn clients_count_their_requests_in_client_gos_metrics() {
        let addr = version_server().await;
        let args = KubeArgs {
            kubeconfig: None,
            kube_api_qps: 100.0,
            kube_api_burst: 1,
            kube_api_timeout: Duration::from_secs(30),
        };
        let host = addr.to_string();
        let m = crate::client::restclient::metrics();
        let waits = || {
            m.rate_limiter
                .with_label_values(&["GET", &host])
                .get_sample_count()
        };
        let count = || m.requests.with_label_values(&["200", "GET", &host]).get();
        let timed = || {
            m.duration
                .with_label_values(&["GET", &host])
                .get_sample_count()
        };
        let config = || Config::new(format!("http://{addr}").parse().unwrap());
        let limited = args
            .build(
                config(),
                RateLimitLayer::new(args.kube_api_qps, args.kube_api_burst),
            )
            .unwrap();
        let own = args.build(config(), None).unwrap();
        limited.apiserver_version().await.unwrap();
        assert_eq!((count(), timed(), waits()), (1, 1, 1));
        // A client outside the token bucket waits for none.
        own.apiserver_version().await.unwrap();
        assert_eq!((count(), timed(), waits()), (2, 2, 1));
        let text = crate::metrics::render(&crate::metrics::registry());
        assert!(
            text.contains(&format!(
                "rest_client_requests_total{{code=\"200\",host=\"{host}\",method=\"GET\"}} 2"
            )) && text.contains(&format!(
                "rest_client_rate_limiter_duration_seconds_count{{host=\"{host}\",verb=\"GET\"}} 1"
            )),
            "{text}"
        );
    }

    fn kubeconfig_part(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Two files, one with the cluster and context, one with the user: the list reads as one
    /// kubeconfig (as kubectl merges KUBECONFIG), the first file winning where both set a value;
    /// a missing file in the list is skipped; a list of only missing files is an error naming it.
    #[tokio::test]
    async fn a_kubeconfig_list_is_merged() {
        let dir = std::env::temp_dir().join(format!("gk-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = kubeconfig_part(
            &dir,
            "a",
            "apiVersion: v1\nkind: Config\ncurrent-context: first\nclusters:\n- name: c\n  cluster:\n    server: https://10.1.2.3:6443\ncontexts:\n- name: first\n  context:\n    cluster: c\n    user: u\n",
        );
        let b = kubeconfig_part(
            &dir,
            "b",
            "apiVersion: v1\nkind: Config\ncurrent-context: second\nclusters:\n- name: c\n  cluster:\n    server: https://10.9.9.9:6443\nusers:\n- name: u\n  user:\n    token: from-b\n",
        );
        let args = |list: String| KubeArgs {
            kubeconfig: Some(PathBuf::from(list)),
            kube_api_qps: 20.0,
            kube_api_burst: 30,
            kube_api_timeout: Duration::from_secs(30),
        };
        let missing = dir.join("missing");
        for list in [
            format!("{}:{}", a.display(), b.display()),
            format!("{}:{}:{}", missing.display(), a.display(), b.display()),
        ] {
            let config = args(list.clone())
                .config()
                .await
                .unwrap_or_else(|e| panic!("{list}: {e}"));
            assert_eq!(
                config.cluster_url.to_string(),
                "https://10.1.2.3:6443/",
                "{list}"
            );
            assert!(config.auth_info.token.is_some(), "{list}: b's token");
            let merged = read_kubeconfigs(std::ffi::OsStr::new(&list)).unwrap();
            assert_eq!(merged.current_context.as_deref(), Some("first"), "{list}");
            let users: Vec<_> = merged.auth_infos.iter().map(|u| u.name.as_str()).collect();
            assert_eq!(users, ["u"], "{list}");
        }
        // Alone, a has no user's token.
        let alone = args(a.display().to_string()).config().await.unwrap();
        assert!(alone.auth_info.token.is_none());
        let list = format!("{}:{}", missing.display(), dir.join("gone").display());
        let e = args(list.clone()).config().await.unwrap_err().to_string();
        assert!(e.contains(&list), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn user_agent_names_the_client() {
        let mut c = Config::new("http://127.0.0.1:1".parse().unwrap());
        set_user_agent(&mut c, "leader-election");
        set_user_agent(&mut c, "leader-election");
        let agents: Vec<_> = c
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap().to_string())
            .collect();
        assert_eq!(agents.len(), 1, "{agents:?}");
        assert!(agents[0].ends_with("; leader-election)"), "{agents:?}");
    }

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("answer", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn api_errors_are_labelled_by_status_class() {
        let table: &[(u16, &str)] = &[
            (403, "forbidden"),
            (404, "not_found"),
            (409, "conflict"),
            (412, "conflict"),
            (429, "too_many_requests"),
            (500, "server_error"),
            (503, "server_error"),
            (504, "server_error"),
            (400, "other"),
            (401, "other"),
            (422, "other"),
            (0, "other"),
        ];
        for &(code, want) in table {
            assert_eq!(api_error_label(&api(code)), want, "HTTP {code}");
        }
        // The rule over every code: 5xx is the apiserver's, and every label is a listed one.
        for code in 0..1000u16 {
            let label = api_error_label(&api(code));
            assert!(API_ERROR_LABELS.contains(&label), "{code}: {label}");
            assert_eq!(
                label == "server_error",
                (500..600).contains(&code),
                "{code}"
            );
        }
    }

    #[test]
    fn unanswered_calls_are_transport_errors() {
        // What RequestTimeoutLayer's deadline becomes once kube wraps it.
        let deadline = kube::Error::Service("GET /api/v1/pods: no answer within 30s".into());
        assert_eq!(api_error_label(&deadline), "transport");
        let reset =
            kube::Error::ReadEvents(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(api_error_label(&reset), "transport");
        let undecodable = kube::Error::SerdeError(serde_json::from_str::<u8>("x").unwrap_err());
        assert_eq!(api_error_label(&undecodable), "other");
        assert_eq!(api_error_label(&kube::Error::TlsRequired), "other");
    }
}
