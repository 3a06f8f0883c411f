//! The port: the certificate served, swapped in place when it changes, and a listener that
//! hands over connections (whose TLS handshake is done, when serving TLS), with the connections
//! and handshakes in progress capped in all and per source address (`sources.rs`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::{ClientHello, ResolvesServerCert, ServerConfig};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use super::sources::{self, Id, Stage, Table};
use super::{Counters, Limits};

/// The certificate served, replaced whole when its source changes; none until it is loaded,
/// and then handshakes fail.
#[derive(Debug, Default)]
pub struct Certificates {
    current: RwLock<Option<(Arc<CertifiedKey>, Vec<u8>)>>,
}

impl Certificates {
    /// Loads a PEM certificate chain and key; returns whether the served certificate changed.
    /// A pair that does not parse or match is refused with the reason and the old one kept.
    pub fn load(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<bool, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("tls.crt: {e}"))?;
        if chain.is_empty() {
            return Err("tls.crt holds no certificate".into());
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("tls.key: {e}"))?;
        let provider = rustls::crypto::ring::default_provider();
        let certified = CertifiedKey::from_der(chain, key, &provider)
            .map_err(|e| format!("tls.crt and tls.key: {e}"))?;
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|(_, pem)| pem == cert_pem) {
            return Ok(false);
        }
        *current = Some((Arc::new(certified), cert_pem.to_vec()));
        Ok(true)
    }

    pub fn is_loaded(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(k, _)| k.clone())
    }
}

/// The server's TLS settings: the ring provider kube already uses, HTTP/1.1.
pub fn server_config(certs: Arc<Certificates>) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(certs);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A connection accepted: TLS or plain TCP.
pub type Stream = Either<TlsStream<TcpStream>, TcpStream>;

/// A connection's place in the listener's table of connections by source: its stage kept
/// current by whoever serves it, taken out when dropped. `replaced` is cancelled when a new
/// connection takes its place: then it must be closed.
pub struct Slot {
    id: Id,
    table: Arc<Mutex<Table<CancellationToken>>>,
    replaced: CancellationToken,
}

impl Slot {
    pub fn stage(&self, stage: Stage) {
        lock(&self.table).set(self.id, stage);
    }

    /// Cancelled when a new connection takes this one's place.
    pub fn replaced(&self) -> &CancellationToken {
        &self.replaced
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.table).remove(self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection accepted (its TLS handshake done, when serving TLS), and its slot among the
/// connections allowed (freed when the connection is dropped).
pub struct Accepted {
    pub stream: Stream,
    pub peer: SocketAddr,
    pub slot: Slot,
}

/// Whether bytes from the client are waiting on `tcp` (a peek that does not wait).
fn has_bytes(tcp: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = 0u8;
    // SAFETY: recv writes at most one byte into `byte`, which outlives the call; the
    // descriptor is `tcp`'s own, open while it is borrowed.
    let n = unsafe {
        libc::recv(
            tcp.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

/// Connections ready to serve HTTP on.
pub struct Listener {
    ready: mpsc::Receiver<Accepted>,
    local: SocketAddr,
    table: Arc<Mutex<Table<CancellationToken>>>,
}

impl Listener {
    /// Binds `addr` now (a port clash fails start-up, naming `flag`) and accepts until `token`
    /// is cancelled. Accepting never waits: a connection over a cap of `limits` (in all, or of
    /// its source address) is closed at once, or replaces one doing nothing
    /// ([`Table::admit`]), so no connection waits in the kernel's backlog behind a cap. With
    /// `tls`, each handshake runs in its own task (a slow client holds up no other), dropped
    /// `limits.handshake_timeout` after the accept.
    pub async fn bind(
        addr: SocketAddr,
        flag: &str,
        tls: Option<Arc<ServerConfig>>,
        limits: &Limits,
        counters: Counters,
        token: CancellationToken,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            std::io::Error::new(e.kind(), format!("{flag} {addr}: cannot listen: {e}"))
        })?;
        let local = listener.local_addr()?;
        // Handed over as fast as the server spawns them; a handshake waits here, never the
        // accepting.
        let (tx, ready) = mpsc::channel(64);
        let acceptor = tls.map(TlsAcceptor::from);
        let table = Arc::new(Mutex::new(Table::new(limits.caps())));
        let (handshake_timeout, name) = (limits.handshake_timeout, limits.name);
        let shared = table.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    _ = token.cancelled() => return,
                    r = listener.accept() => match r {
                        Ok(c) => c,
                        Err(e) => {
                            // Out of file descriptors, most likely: the connection waits in
                            // the backlog until one closes.
                            tracing::warn!(error = %e, "{name}: accepting a connection failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    },
                };
                // A client that has sent its first bytes by the time it is accepted (a TLS
                // client sends its hello at once) is speaking already: never replaced as silent.
                let stage = match acceptor {
                    Some(_) if has_bytes(&tcp) => Stage::Handshake,
                    Some(_) => Stage::Silent,
                    None => Stage::Idle,
                };
                let replaced = CancellationToken::new();
                let admitted =
                    lock(&shared).admit(sources::source(peer.ip()), stage, replaced.clone());
                let id = match admitted {
                    Ok((id, gone)) => {
                        for g in gone {
                            counters.refused("replaced");
                            g.cancel();
                        }
                        id
                    }
                    Err(refusal) => {
                        counters.refused(refusal.reason());
                        tracing::debug!(%peer, reason = refusal.reason(), "{name}: connection closed at once");
                        // A reset, so that neither side keeps the closed connection around.
                        let _ = tcp.set_zero_linger();
                        continue;
                    }
                };
                let slot = Slot {
                    id,
                    table: shared.clone(),
                    replaced,
                };
                let (tx, counters, token) = (tx.clone(), counters.clone(), token.clone());
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let stream = match acceptor {
                        None => Either::Right(tcp),
                        Some(acceptor) => {
                            let shaken = async {
                                // Silent until the first byte: the stage whose connections a
                                // new one from the same source may replace. (peek, not
                                // readable(): readiness may be reported before a byte is.)
                                if stage == Stage::Silent {
                                    tcp.peek(&mut [0u8; 1]).await?;
                                    slot.stage(Stage::Handshake);
                                }
                                acceptor.accept(tcp).await
                            };
                            let shaken = tokio::select! {
                                _ = token.cancelled() => return,
                                _ = slot.replaced.cancelled() => return,
                                r = tokio::time::timeout(handshake_timeout, shaken) => r,
                            };
                            match shaken {
                                Ok(Ok(tls)) => Either::Left(tls),
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "{name}: TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    counters.refused("handshake_timeout");
                                    tracing::debug!(%peer, "{name}: TLS handshake timed out");
                                    return;
                                }
                            }
                        }
                    };
                    slot.stage(Stage::Idle);
                    let _ = tx.send(Accepted { stream, peer, slot }).await;
                });
            }
        });
        Ok(Self {
            ready,
            local,
            table,
        })
    }

    /// The next connection; None once accepting has stopped (shutdown).
    pub async fn accept(&mut self) -> Option<Accepted> {
        self.ready.recv().await
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Connections open, and of them handshaking.
    pub fn held(&self) -> (usize, usize) {
        lock(&self.table).held()
    }
}
