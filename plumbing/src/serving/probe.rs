//! `controller-manager probe URL...`: what the chart's `helm test` runs to ask each admin server
//! for `/readyz`, from the image under test. A shell image's `wget` can not do it over HTTPS:
//! busybox's own TLS sends no `signature_algorithms`, which rustls (and TLS 1.3) require. Like
//! kubelet's HTTPS probes it does not verify the certificate: it sends nothing secret and only
//! learns whether the endpoint answers 200.

use std::{sync::Arc, time::Duration};

use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature},
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::parse_duration;

#[derive(clap::Args, Debug, Clone)]
pub struct ProbeArgs {
    /// The URLs to GET (http:// or https://HOST:PORT/PATH); each must answer 200.
    #[arg(required = true)]
    pub urls: Vec<String>,
    /// Attempts per URL before it counts as failed.
    #[arg(long, default_value_t = 10)]
    pub tries: u32,
    /// Wait between two attempts.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub interval: Duration,
    /// SUBSTRING=TEXT: when a URL containing SUBSTRING fails, print TEXT after the failure
    /// (what to look at next).
    #[arg(long = "hint", value_name = "SUBSTRING=TEXT")]
    pub hints: Vec<String>,
}

/// Longest wait for one attempt (connect, handshake, answer).
const ATTEMPT: Duration = Duration::from_secs(5);
/// The status line and headers read at most.
const HEAD_MAX: usize = 16 << 10;

/// Exit status: 0 when every URL answered 200 within its tries, 1 otherwise (each failure
/// said on stderr).
pub async fn run(args: &ProbeArgs) -> u8 {
    let mut failed = false;
    for url in &args.urls {
        let mut last = String::new();
        let mut ok = false;
        for attempt in 1..=args.tries.max(1) {
            match tokio::time::timeout(ATTEMPT, status(url)).await {
                Ok(Ok(200)) => {
                    println!("{url}: 200");
                    ok = true;
                    break;
                }
                Ok(Ok(code)) => last = format!("answered {code}"),
                Ok(Err(e)) => last = e,
                Err(_) => last = format!("no answer within {ATTEMPT:?}"),
            }
            if attempt < args.tries {
                tokio::time::sleep(args.interval).await;
            }
        }
        if !ok {
            eprintln!("FAIL: {url}: {last}");
            for (part, text) in args.hints.iter().filter_map(|h| h.split_once('=')) {
                if url.contains(part) {
                    eprintln!("{text}");
                }
            }
            failed = true;
        }
    }
    u8::from(failed)
}

struct Target {
    tls: bool,
    host: String,
    port: u16,
    path: String,
}

fn parse(url: &str) -> Result<Target, String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("{url:?}: not an http:// or https:// URL"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("{url:?}: the port {p:?} is not a number"))?,
        ),
        _ => (authority, if tls { 443 } else { 80 }),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{url:?}: no host"));
    }
    Ok(Target {
        tls,
        host: host.to_string(),
        port,
        path: path.to_string(),
    })
}

/// The status code of a GET of `url`.
async fn status(url: &str) -> Result<u16, String> {
    let t = parse(url)?;
    let tcp = tokio::net::TcpStream::connect((t.host.as_str(), t.port))
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: groundskeeper-probe\r\nConnection: close\r\n\r\n",
        t.path, t.host
    );
    if t.tls {
        let name = ServerName::try_from(t.host.clone()).map_err(|e| format!("{e}"))?;
        let mut tls = tokio_rustls::TlsConnector::from(client_config()?)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        exchange(&mut tls, &request).await
    } else {
        let mut tcp = tcp;
        exchange(&mut tcp, &request).await
    }
}

async fn exchange<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    s: &mut S,
    request: &str,
) -> Result<u16, String> {
    s.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("sending: {e}"))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < HEAD_MAX {
        let n = s
            .read(&mut buf)
            .await
            .map_err(|e| format!("reading: {e}"))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let line = line.lines().next().unwrap_or_default();
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .filter(|_| line.starts_with("HTTP/1."))
        .ok_or_else(|| format!("not an HTTP answer: {line:?}"))
}

fn client_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Accepts any certificate (the probe learns only a status code), but still checks that the
/// handshake is signed by the certificate's key.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_or_refused_with_the_reason() {
        let t = parse("https://gk-metrics:8080/readyz").unwrap();
        assert!(t.tls && t.host == "gk-metrics" && t.port == 8080 && t.path == "/readyz");
        let t = parse("http://[fd00::1]:9846/healthz").unwrap();
        assert!(!t.tls && t.host == "fd00::1" && t.port == 9846);
        let t = parse("https://example").unwrap();
        assert!(t.port == 443 && t.path == "/");
        for (bad, why) in [
            ("ftp://x/", "not an http"),
            ("https://x:port/", "not a number"),
            ("https://:80/", "no host"),
        ] {
            let e = parse(bad).err().unwrap();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// Against the admin server over HTTPS (a self-signed certificate): 200 for /healthz,
    /// and a failure, said, for /readyz while a watch has not listed.
    #[tokio::test]
    async fn an_https_admin_server_is_probed_and_a_not_ready_one_fails() {
        let (cert, key) = super::super::self_signed::issue(
            &["localhost".to_string()],
            time::OffsetDateTime::now_utc(),
        )
        .unwrap();
        let certs = Arc::new(super::super::Certificates::default());
        certs.load(cert.as_bytes(), key.as_bytes()).unwrap();
        let readiness = crate::Readiness::default();
        let _flag = readiness.register("pods");
        let token = tokio_util::sync::CancellationToken::new();
        let (addr, serve) = crate::serving::admin::bind(
            "127.0.0.1:0".parse().unwrap(),
            crate::metrics::registry(),
            readiness,
            None,
            Some(super::super::server_config(certs).unwrap()),
            token.clone(),
        )
        .await
        .unwrap();
        let server = tokio::spawn(serve);
        let args = |path: &str| ProbeArgs {
            urls: vec![format!("https://localhost:{}{path}", addr.port())],
            tries: 2,
            interval: Duration::from_millis(10),
            hints: vec![],
        };
        assert_eq!(run(&args("/healthz")).await, 0);
        assert_eq!(run(&args("/readyz")).await, 1);
        assert_eq!(
            status(&format!("http://127.0.0.1:{}/healthz", addr.port()))
                .await
                .ok(),
            None,
            "plain HTTP to the TLS port is no answer"
        );
        token.cancel();
        server.await.unwrap().unwrap();
    }
}
