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
#[command(next_help_heading = "Kubernetes API client")]
pub struct KubeArgs {
    /// Path to a kubeconfig, or several separated by ':' (merged as kubectl merges them: the
    /// first file to set a value wins; missing files are skipped while one exists). Unset: the
    /// KUBECONFIG environment variable (the same list), else ~/.kube/config, else in-cluster.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Sustained API requests per second this process may make (<= 0: unlimited).
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
    let instance = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
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

/// Parses a duration the way Go's `time.ParseDuration` does (what kube-controller-manager's
/// flags take): a sequence of decimal numbers, each with an optional fraction and a unit, `ns`,
/// `us` (or `µs`), `ms`, `s`, `m`, `h` (`300ms`, `1.5h`, `1h30m`, `.5s`, `+2m`), or `0`. Also,
/// as before Go syntax was accepted, a bare number of seconds (`40`, `1.5`). Negative
/// durations (other than `-0`) and anything over [`MAX_DURATION`] are refused, naming the value.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return bare_seconds(s);
    }
    let nanos = go_duration_nanos(s).map_err(|why| format!("{s:?} is not a duration: {why}"))?;
    if nanos > MAX_DURATION.as_nanos() {
        return Err(format!(
            "{s:?} is longer than the maximum, 8784h (366 days)"
        ));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

const EXAMPLES: &str = "examples: 500ms, 30s, 2m, 1h30m, 1.5s";

fn bare_seconds(s: &str) -> Result<Duration, String> {
    let n: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a duration ({EXAMPLES})"))?;
    if n > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "{s:?} is longer than the maximum, 8784h (366 days)"
        ));
    }
    Ok(Duration::from_secs_f64(n))
}

/// Go's `time.ParseDuration` grammar, `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` or `0`, to
/// nanoseconds; like Go, a fraction adds `fraction × unit` truncated to whole nanoseconds. Sums
/// saturate (anything that large is refused by the caller); a negative non-zero value is an
/// error here.
fn go_duration_nanos(s: &str) -> Result<u128, String> {
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(EXAMPLES.into());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = |t: &str| t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let int_len = digits(rest);
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(f) => f.split_at(digits(f)),
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(format!("a number must come before each unit ({EXAMPLES})"));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => {
                return Err(format!(
                    "missing unit after {:?} ({EXAMPLES})",
                    &rest[..rest.len() - after.len()]
                ));
            }
            _ => return Err(format!("unknown unit {unit:?} (use ns, us, ms, s, m or h)")),
        };
        // Past 30 integer digits the value is far over any maximum: saturate, do not overflow.
        let whole: u128 = if int.len() > 30 {
            u128::MAX
        } else {
            int.parse().unwrap_or(0)
        };
        total = total.saturating_add(whole.saturating_mul(per_unit));
        total = total.saturating_add(fraction_nanos(frac, per_unit));
        rest = after;
    }
    if negative && total > 0 {
        return Err("a duration cannot be negative".into());
    }
    Ok(total)
}

/// `0.frac × per_unit` in whole nanoseconds, computed as Go does: the fraction's digits as an
/// integer (digits past what fits in an int64 are dropped), then `f × (unit / scale)` in
/// float64, truncated.
fn fraction_nanos(frac: &str, per_unit: u128) -> u128 {
    let (mut f, mut scale) = (0u64, 1f64);
    for d in frac.bytes() {
        let next = f
            .checked_mul(10)
            .and_then(|x| x.checked_add(u64::from(d - b'0')));
        match next {
            Some(x) if x <= i64::MAX as u64 => {
                f = x;
                scale *= 10.0;
            }
            _ => break,
        }
    }
    (f as f64 * (per_unit as f64 / scale)) as u128
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

    /// Go's own examples and corner cases (time.ParseDuration's tests), and the forms we
    /// accepted before Go syntax (a bare number of seconds).
    #[test]
    fn go_duration_syntax() {
        let ns = Duration::from_nanos;
        for (text, want) in [
            ("0", ns(0)),
            ("5s", Duration::from_secs(5)),
            ("30s", Duration::from_secs(30)),
            ("1478s", Duration::from_secs(1478)),
            ("-0", ns(0)),
            ("+5s", Duration::from_secs(5)),
            ("-0s", ns(0)),
            ("+0s", ns(0)),
            ("5.0s", Duration::from_secs(5)),
            ("5.6s", Duration::from_millis(5600)),
            ("5.s", Duration::from_secs(5)),
            (".5s", Duration::from_millis(500)),
            ("1.0s", Duration::from_secs(1)),
            ("1.00s", Duration::from_secs(1)),
            ("1.004s", Duration::from_millis(1004)),
            ("1.0040s", Duration::from_millis(1004)),
            ("100.00100s", Duration::from_millis(100_001)),
            ("10ns", ns(10)),
            ("11us", ns(11_000)),
            ("12\u{b5}s", ns(12_000)),
            ("12\u{3bc}s", ns(12_000)),
            ("13ms", ns(13_000_000)),
            ("14s", Duration::from_secs(14)),
            ("15m", Duration::from_secs(900)),
            ("16h", Duration::from_secs(16 * 3600)),
            ("3h30m", Duration::from_secs(3 * 3600 + 1800)),
            ("1h30m", Duration::from_secs(5400)),
            ("10.5s4m", Duration::from_millis(4 * 60_000 + 10_500)),
            ("1h2m3s4ms5us6ns", ns(3_723_004_005_006)),
            ("39h9m14.425s", Duration::from_millis(140_954_425)),
            ("52763797000ns", ns(52_763_797_000)),
            ("0.3333333333333333333h", ns(1_200_000_000_000)),
            ("0.100000000000000000000h", Duration::from_secs(360)),
            ("1.5ns", ns(1)),
            (" 1h30m ", Duration::from_secs(5400)),
            // Before Go syntax: a bare number is seconds.
            ("1.5", Duration::from_millis(1500)),
            ("40", Duration::from_secs(40)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
        for bad in [
            "-", "+", "-3", "s", ".", "-.", ".s", "+.s", "1d", "1..5s", "1.5.s", "3000000h", "-1s",
            "-1ns", "1s-2s", "1 s", "1h 30m", "h1", "1e3s", "1\u{b5}", "0x10s",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(&format!("{:?}", bad.trim())), "{bad:?}: {e}");
        }
    }

    /// splitmix64: seeded, so a failing case can be replayed from its seed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// The rule, over generated strings: a sum of parts `<int>[.<frac>]<unit>`, in any order
    /// and with units repeated, as Go writes and reads them, parses to the exact sum of its
    /// parts. Fractions are kept to the digits a unit divides into whole nanoseconds, where
    /// Go's float arithmetic is exact too; an optional leading `+`; `.5s` and `5.s` forms.
    #[test]
    fn sums_of_unit_parts_parse_to_their_exact_sum() {
        // (spelling, nanoseconds, most fraction digits that stay whole nanoseconds)
        const UNITS: [(&str, u128, u32); 9] = [
            ("ns", 1, 0),
            ("us", 1_000, 3),
            ("\u{b5}s", 1_000, 3),
            ("\u{3bc}s", 1_000, 3),
            ("ms", 1_000_000, 6),
            ("s", 1_000_000_000, 9),
            ("m", 60_000_000_000, 10),
            ("h", 3_600_000_000_000, 11),
            ("h", 3_600_000_000_000, 0),
        ];
        for seed in 0..5000u64 {
            let mut rng = Rng(seed);
            let mut text = String::new();
            let mut want: u128 = 0;
            if rng.below(4) == 0 {
                text.push('+');
            }
            for _ in 0..1 + rng.below(5) {
                let (unit, per, max_frac) = UNITS[rng.below(UNITS.len() as u64) as usize];
                // Small enough that five parts stay under the 8784h maximum.
                let whole = match rng.below(3) {
                    0 => 0,
                    1 => rng.below(100),
                    _ => rng.below(1_000_000_000_000_000) / per as u64 / 5,
                } as u128;
                let frac_digits = if max_frac == 0 {
                    0
                } else {
                    rng.below(u64::from(max_frac) + 1) as u32
                };
                let frac = if frac_digits == 0 {
                    0
                } else {
                    rng.below(10u64.pow(frac_digits)) as u128
                };
                let int_text = if whole == 0 && frac_digits > 0 && rng.below(2) == 0 {
                    String::new() // `.5s`
                } else {
                    whole.to_string()
                };
                text.push_str(&int_text);
                if frac_digits > 0 {
                    text.push_str(&format!(".{frac:0width$}", width = frac_digits as usize));
                } else if rng.below(8) == 0 {
                    text.push('.'); // `5.s`
                }
                text.push_str(unit);
                want += whole * per + frac * per / 10u128.pow(frac_digits);
            }
            let got = parse_duration(&text)
                .unwrap_or_else(|e| panic!("seed {seed}: {text:?} refused: {e}"));
            assert_eq!(got.as_nanos(), want, "seed {seed}: {text:?}");
        }
    }

    /// Every generated string that is not Go syntax (a part without digits, without a unit, or
    /// with an unknown unit) is refused, naming the string.
    #[test]
    fn strings_outside_the_grammar_are_refused_by_name() {
        let parts = [
            "1", ".", "5.", ".5", "2", "s", "ms", "h", "x", "d", "e", "-", " ", "µs", "us",
        ];
        for seed in 0..5000u64 {
            let mut rng = Rng(seed);
            let text: String = (0..1 + rng.below(5))
                .map(|_| parts[rng.below(parts.len() as u64) as usize])
                .collect();
            let trimmed = text.trim();
            let go_ok = is_go_duration(trimmed)
                || (!trimmed.is_empty()
                    && trimmed.chars().all(|c| c.is_ascii_digit() || c == '.')
                    && trimmed.parse::<f64>().is_ok());
            match parse_duration(&text) {
                Ok(_) => assert!(go_ok, "seed {seed}: {text:?} accepted"),
                Err(e) => {
                    assert!(!go_ok, "seed {seed}: {text:?} refused: {e}");
                    assert!(e.contains(&format!("{trimmed:?}")), "{e}");
                }
            }
        }
    }

    /// Go's grammar as a recogniser, independent of the parser: `[-+]?` then one or more
    /// `digits* (. digits*)? unit` with a digit somewhere in the number, or `0`; negatives
    /// only when zero (none are generated above).
    fn is_go_duration(s: &str) -> bool {
        let s = s.strip_prefix('+').unwrap_or(s);
        if s == "0" {
            return true;
        }
        let units = ["ns", "us", "\u{b5}s", "\u{3bc}s", "ms", "s", "m", "h"];
        let mut rest = s;
        if rest.is_empty() {
            return false;
        }
        while !rest.is_empty() {
            let n = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            let number = &rest[..n];
            if number.matches('.').count() > 1 || !number.chars().any(|c| c.is_ascii_digit()) {
                return false;
            }
            let tail = &rest[n..];
            let u = tail
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(tail.len());
            if !units.contains(&&tail[..u]) {
                return false;
            }
            rest = &tail[u..];
        }
        true
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
}
