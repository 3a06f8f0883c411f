//! The Kubernetes client: in-cluster config or a kubeconfig, timeouts on every call, and the
//! client-side QPS budget.

use std::{path::PathBuf, time::Duration};

use clap::Args;
use kube::{
    Client, Config,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::{ratelimit::RateLimitLayer, timeout::RequestTimeoutLayer};

#[derive(Args, Clone, Debug)]
pub struct KubeArgs {
    /// Path to a kubeconfig. Unset: in-cluster config, else the default kubeconfig.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Sustained API requests per second this process may make (<= 0: unlimited).
    #[arg(long, env = "KUBE_API_QPS", default_value_t = 20.0, value_parser = parse_qps)]
    pub kube_api_qps: f32,

    /// Requests allowed in a burst above --kube-api-qps.
    #[arg(long, env = "KUBE_API_BURST", default_value_t = 30)]
    pub kube_api_burst: u32,

    /// Deadline of one API request; watches are exempt (the server closes them).
    #[arg(long, env = "KUBE_API_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
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

impl KubeArgs {
    pub async fn config(&self) -> Result<Config, ClientError> {
        let mut config = match &self.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?;
                Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                    .await
                    .map_err(|source| ClientError::Kubeconfig {
                        path: path.clone(),
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
        let mut config = self.config().await?;
        set_user_agent(&mut config, "leader-election");
        tracing::info!(server = %config.cluster_url, "leader election client");
        self.build(config, None)
    }

    fn build(&self, config: Config, limit: Option<RateLimitLayer>) -> Result<Client, ClientError> {
        // The deadline sits inside the rate limiter: time spent waiting for a token is not a hang.
        let builder = ClientBuilder::try_from(config)?
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

/// The longest duration a flag takes: no housekeeping interval needs more, and well below it
/// no timer or deadline can overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses `30s`, `500ms`, `2m`, `1h`, or a bare number of seconds, up to `MAX_DURATION`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 500ms, 30s, 2m, 1h)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "{s:?} has unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a non-negative duration"));
    }
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "{s:?} is longer than the maximum, 8784h (366 days)"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("40"), Ok(Duration::from_secs(40)));
        let e = parse_duration("10x").unwrap_err();
        assert!(e.contains("10x") && e.contains("unit"), "{e}");
        assert!(parse_duration("abc").unwrap_err().contains("abc"));
        assert!(parse_duration("").is_err());
        for huge in ["99999999999999999999999s", "1e20s", "10000000h", "8785h"] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.contains(huge), "{huge}: {e}");
        }
        assert_eq!(parse_duration("8784h"), Ok(MAX_DURATION));
    }

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
}
