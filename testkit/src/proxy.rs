//! A TCP proxy a test can freeze: a network partition between one process and the apiserver.
//!
//! Frozen, it stops moving bytes in both directions but keeps every connection open (new ones
//! are accepted and held too), so the client sees requests hang rather than fail, as behind a
//! dead link. Bytes that arrive while frozen wait in the proxy; `resume` lets them through.

use std::net::SocketAddr;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinSet,
};

pub struct Proxy {
    addr: SocketAddr,
    frozen: watch::Sender<bool>,
    // Aborted on drop: every connection through the proxy ends with it.
    _tasks: JoinSet<()>,
}

impl Proxy {
    /// Listens on a free 127.0.0.1 port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        Self::serve(TcpListener::bind("127.0.0.1:0").await?, upstream)
    }

    /// Listens on a free 127.0.0.1 port inside the network namespace `netns` (`ip netns`
    /// name) and forwards every connection to `upstream` in this process's namespace: how a
    /// process confined to that namespace (kube-proxy in a bench) reaches the test apiserver.
    pub async fn start_in_netns(upstream: SocketAddr, netns: &str) -> std::io::Result<Self> {
        let path = format!("/run/netns/{netns}");
        // A thread of its own enters the namespace: a socket stays in the namespace it was
        // made in, and the thread (with its namespace) ends right after.
        let listener = std::thread::spawn(move || -> std::io::Result<std::net::TcpListener> {
            let ns = std::fs::File::open(&path)?;
            // SAFETY: setns on a valid namespace fd, affecting only this thread.
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .join()
        .map_err(|_| std::io::Error::other("the netns thread panicked"))??;
        Self::serve(TcpListener::from_std(listener)?, upstream)
    }

    fn serve(listener: TcpListener, upstream: SocketAddr) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (frozen, rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let rx = rx.clone();
                conns.spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, rx.clone()), pump(sr, cw, rx));
                });
                // Reap finished connections so the set does not grow for ever.
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            frozen,
            _tasks: tasks,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://<addr>`, for a kubeconfig's `server:`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Stops forwarding in both directions; connections stay open.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    pub fn resume(&self) {
        self.frozen.send_replace(false);
    }
}

/// Copies `from` to `to`, holding bytes while frozen. A read that completes during a freeze is
/// held back until `resume`, so nothing passes once `freeze` returned (bar a write in progress).
async fn pump<R, W>(mut from: R, mut to: W, mut frozen: watch::Receiver<bool>)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A copy of `kubeconfig` whose clusters' `server:` is `server`; the path of the copy.
pub fn kubeconfig_with_server(
    kubeconfig: &std::path::Path,
    server: &str,
) -> anyhow::Result<std::path::PathBuf> {
    let mut doc: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(kubeconfig)?)?;
    let clusters = doc
        .get_mut("clusters")
        .and_then(|c| c.as_sequence_mut())
        .ok_or_else(|| anyhow::anyhow!("{} has no clusters", kubeconfig.display()))?;
    for c in clusters {
        if let Some(cluster) = c.get_mut("cluster").and_then(|c| c.as_mapping_mut()) {
            cluster.insert("server".into(), server.into());
        }
    }
    let dir = std::env::temp_dir().join("groundskeeper-tests");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{}.kubeconfig", crate::unique_name("via-proxy")));
    std::fs::write(&path, serde_norway::to_string(&doc)?)?;
    Ok(path)
}

/// The apiserver's address in `kubeconfig` (`https://<ip>:<port>`), to put a [`Proxy`] in
/// front of; `None` when the server is named by host name.
pub fn apiserver_addr(kubeconfig: &std::path::Path) -> anyhow::Result<Option<SocketAddr>> {
    let doc: serde_norway::Value = serde_norway::from_str(&std::fs::read_to_string(kubeconfig)?)?;
    let server = doc["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap_or_default();
    Ok(server.trim_start_matches("https://").parse().ok())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn forwards_then_holds_while_frozen_then_resumes() {
        // An echo server upstream.
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let proxy = Proxy::start(upstream).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 5];
        c.write_all(b"hello").await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");

        proxy.freeze();
        c.write_all(b"world").await.unwrap();
        let held = tokio::time::timeout(Duration::from_millis(300), c.read_exact(&mut buf)).await;
        assert!(held.is_err(), "nothing passes while frozen");
        // A new connection is accepted but hangs too.
        let mut c2 = TcpStream::connect(proxy.addr()).await.unwrap();
        c2.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        let held = tokio::time::timeout(Duration::from_millis(300), c2.read_exact(&mut one)).await;
        assert!(held.is_err());

        proxy.resume();
        tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"world");
        tokio::time::timeout(Duration::from_secs(5), c2.read_exact(&mut one))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&one, b"x");
    }
}
