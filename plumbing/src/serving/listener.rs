//! The port: the certificate served, swapped in place when it changes, and a listener that
//! hands over connections (whose TLS handshake is done, when serving TLS), with the connections
//! and handshakes in progress capped.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::{ClientHello, ResolvesServerCert, ServerConfig};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

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

/// A connection accepted (its TLS handshake done, when serving TLS), and its slot among the
/// connections allowed (freed when the connection is dropped).
pub struct Accepted {
    pub stream: Stream,
    pub peer: SocketAddr,
    pub slot: OwnedSemaphorePermit,
}

/// Connections ready to serve HTTP on.
pub struct Listener {
    ready: mpsc::Receiver<Accepted>,
    local: SocketAddr,
}

impl Listener {
    /// Binds `addr` now (a port clash fails start-up, naming `flag`) and accepts until `token`
    /// is cancelled: up to `limits.connections` open at once; with `tls`, up to
    /// `limits.handshakes` handshaking, each handshake in its own task (so a slow client holds
    /// up no other) and dropped after `limits.handshake_timeout`. At either cap, accepting
    /// waits: new connections queue in the kernel's backlog, costing this process nothing.
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
        let (tx, ready) = mpsc::channel(64);
        let acceptor = tls.map(TlsAcceptor::from);
        let connections = Arc::new(Semaphore::new(limits.connections));
        let handshakes = Arc::new(Semaphore::new(limits.handshakes));
        let (handshake_timeout, name) = (limits.handshake_timeout, limits.name);
        tokio::spawn(async move {
            loop {
                // The semaphores are never closed: acquiring fails only if they were.
                let slots = async {
                    let slot = connections.clone().acquire_owned().await.ok()?;
                    let handshake = match acceptor {
                        Some(_) => Some(handshakes.clone().acquire_owned().await.ok()?),
                        None => None,
                    };
                    Some((slot, handshake))
                };
                let (slot, handshake) = tokio::select! {
                    _ = token.cancelled() => return,
                    s = slots => match s { Some(s) => s, None => return },
                };
                let (tcp, peer) = tokio::select! {
                    _ = token.cancelled() => return,
                    r = listener.accept() => match r {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!(error = %e, "{name}: accepting a connection failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                };
                let Some(acceptor) = acceptor.clone() else {
                    let accepted = Accepted {
                        stream: Either::Right(tcp),
                        peer,
                        slot,
                    };
                    if tx.send(accepted).await.is_err() {
                        return;
                    }
                    continue;
                };
                let (tx, counters) = (tx.clone(), counters.clone());
                tokio::spawn(async move {
                    let shaken =
                        tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await;
                    drop(handshake);
                    match shaken {
                        Ok(Ok(tls)) => {
                            let stream = Either::Left(tls);
                            let _ = tx.send(Accepted { stream, peer, slot }).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "{name}: TLS handshake failed")
                        }
                        Err(_) => {
                            counters.refused("handshake_timeout");
                            tracing::debug!(%peer, "{name}: TLS handshake timed out")
                        }
                    }
                });
            }
        });
        Ok(Self { ready, local })
    }

    /// The next connection; None once accepting has stopped (shutdown).
    pub async fn accept(&mut self) -> Option<Accepted> {
        self.ready.recv().await
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}
