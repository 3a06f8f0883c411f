//! Hostile callers of an HTTPS server, and the clients that must still be served meanwhile:
//! silent TCP connections, headers and bodies dribbled a byte at a time, each from a source
//! address of the test's choosing (the whole of 127/8 is loopback on Linux, so 127.0.0.2 is
//! another caller than 127.0.0.1), and a probe and a legitimate client that time what they get.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;

/// Raises this process's soft limit of open files to `want` (or to the hard limit, if lower);
/// returns the limit now in force.
pub fn raise_open_files(want: u64) -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 0;
        }
        if l.rlim_cur < want {
            l.rlim_cur = want.min(l.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        }
    }
    l.rlim_cur
}

/// An HTTPS server under test: where it listens, and a client that trusts `ca_pem` and
/// expects the name `127.0.0.1`.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    connector: TlsConnector,
}

impl Target {
    pub fn new(addr: SocketAddr, ca_pem: &str) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.expect("a PEM certificate")).expect("a CA");
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Self {
            addr,
            connector: TlsConnector::from(Arc::new(config)),
        }
    }

    /// A server reached over the network by a caller that checks no certificate: a hostile
    /// pod, which has no reason to trust the server it attacks.
    pub fn unverified(addr: SocketAddr) -> Self {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate))
        .with_no_client_auth();
        Self {
            addr,
            connector: TlsConnector::from(Arc::new(config)),
        }
    }

    /// A TCP connection from `source`.
    pub async fn tcp(&self, source: IpAddr) -> std::io::Result<TcpStream> {
        let socket = match source {
            IpAddr::V4(_) => TcpSocket::new_v4()?,
            IpAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.bind(SocketAddr::new(source, 0))?;
        socket.connect(self.addr).await
    }

    /// A TLS connection from `source`.
    pub async fn tls(
        &self,
        source: IpAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = self.tcp(source).await?;
        let name = ServerName::try_from("127.0.0.1").expect("a name");
        self.connector.connect(name, tcp).await
    }

    /// `request` sent on a new connection from `source` (as kubelet probes: one connection
    /// per request): the status code, or why there was none.
    pub async fn call(&self, source: IpAddr, request: &[u8]) -> Result<u16, String> {
        let mut s = self
            .tls(source)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        s.write_all(request)
            .await
            .map_err(|e| format!("send: {e}"))?;
        status(&mut s).await.ok_or_else(|| "no answer".to_string())
    }
}

/// A GET of `path` that closes the connection after the answer.
pub fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes()
}

/// A POST of `body` (JSON) to `path`, closing the connection after the answer.
pub fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// The status code of the answer on `s`, reading until its headers end.
pub async fn status<S: AsyncRead + Unpin>(s: &mut S) -> Option<u16> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// What the attackers managed: connections opened, and those the server closed.
#[derive(Default)]
pub struct Tally {
    pub opened: AtomicU64,
    pub closed: AtomicU64,
}

impl Tally {
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::Relaxed)
    }
}

/// What an attacker does on each of its connections.
#[derive(Clone, Copy, Debug)]
pub enum Attack {
    /// Opens TCP and sends nothing.
    Silent,
    /// Completes TLS, then sends a request's headers a byte at a time, never ending them.
    SlowHeaders,
    /// Completes TLS, sends `POST path` headers declaring `len` bytes (None: chunked), then
    /// the body a byte at a time.
    SlowBody {
        path: &'static str,
        len: Option<usize>,
    },
}

/// `n` connections from `source` to `target`, each doing `attack` and opened again as soon as
/// the server closes it (after `pause`), until the set is dropped or aborted.
pub fn attack(
    target: &Target,
    source: IpAddr,
    n: usize,
    what: Attack,
    pause: Duration,
    tally: Arc<Tally>,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for _ in 0..n {
        let (target, tally) = (target.clone(), tally.clone());
        set.spawn(async move {
            loop {
                if hold(&target, source, what, &tally).await.is_err() {
                    // Refused before it was open (closed at the accept, reset): try again.
                }
                tally.closed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(pause).await;
            }
        });
    }
    set
}

/// One connection doing `what` until the server closes it.
async fn hold(target: &Target, source: IpAddr, what: Attack, tally: &Tally) -> std::io::Result<()> {
    match what {
        Attack::Silent => {
            let mut s = target.tcp(source).await?;
            tally.opened.fetch_add(1, Ordering::Relaxed);
            let mut buf = [0u8; 64];
            while s.read(&mut buf).await? > 0 {}
            Ok(())
        }
        Attack::SlowHeaders => {
            let mut s = target.tls(source).await?;
            tally.opened.fetch_add(1, Ordering::Relaxed);
            let head = b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Slow: ";
            dribble(&mut s, head.iter().chain(std::iter::repeat(&b'a'))).await
        }
        Attack::SlowBody { path, len } => {
            let mut s = target.tls(source).await?;
            tally.opened.fetch_add(1, Ordering::Relaxed);
            let head = match len {
                Some(n) => {
                    format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n")
                }
                None => format!(
                    "POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffff\r\n"
                ),
            };
            s.write_all(head.as_bytes()).await?;
            dribble(&mut s, std::iter::repeat(&b'{')).await
        }
    }
}

/// Writes `bytes` one every 100 ms until the server closes the connection (or answers it,
/// which for a request that never ends is a refusal).
async fn dribble<'a, S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    bytes: impl Iterator<Item = &'a u8>,
) -> std::io::Result<()> {
    let mut buf = [0u8; 512];
    for b in bytes {
        tokio::select! {
            r = s.read(&mut buf) => { r?; return Ok(()) }
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        s.write_all(std::slice::from_ref(b)).await?;
    }
    Ok(())
}

/// Every `every`, for `for_`, `request` on a new connection from `source`: each answer's status
/// (or error) and how long it took.
pub async fn every(
    target: &Target,
    source: IpAddr,
    request: Vec<u8>,
    every: Duration,
    for_: Duration,
) -> Vec<(Result<u16, String>, Duration)> {
    let end = Instant::now() + for_;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    while Instant::now() < end {
        tick.tick().await;
        let start = Instant::now();
        // Bounded as kubelet bounds a probe, with room to see how late a late one was.
        let r = match tokio::time::timeout(Duration::from_secs(5), target.call(source, &request))
            .await
        {
            Ok(r) => r,
            Err(_) => Err("no answer within 5 s".to_string()),
        };
        out.push((r, start.elapsed()));
    }
    out
}

/// The `p`th percentile (0-100) of `times`, in milliseconds.
pub fn percentile_ms(times: &[Duration], p: f64) -> f64 {
    let mut ms: Vec<f64> = times.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (ms.len() - 1) as f64).round() as usize;
    ms[i.min(ms.len() - 1)]
}

/// Accepts any server certificate (the attacker's view: it verifies nothing).
#[derive(Debug)]
struct AnyCertificate;

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
