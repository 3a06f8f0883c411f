//! Reads the ServiceAccount issuer and its keys from the apiserver
//! (`/.well-known/openid-configuration`, `/openid/v1/jwks`), when first needed and again when a
//! token names a key not held or the keys are old, at most once per [`FETCH_EVERY`]: a flood of
//! tokens naming unknown keys costs at most one read per interval. While they can not be read
//! (403, not served, the apiserver down), tokens are judged by the apiserver alone, as they are
//! without this check; that is logged once, and the read is tried again later.

use std::{
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{Request, StatusCode};
use http_body::Body as _;
use kube::client::Body;
use tokio::time::Instant;

use super::jwks::{DOCUMENT_MAX, KeySet};

/// The least time between two reads of the keys (and between tries while they fail).
pub const FETCH_EVERY: Duration = Duration::from_secs(30);
/// Keys read longer ago are read again when next needed: an issuer or keys changed on the
/// apiserver are taken up within this long even when no token names a new key.
pub const FRESH_FOR: Duration = Duration::from_secs(600);
/// How long one read (both documents) may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
const JWKS_PATH: &str = "/openid/v1/jwks";

/// The keys held, and when they may be read again.
#[derive(Default)]
struct State {
    keys: Option<Arc<KeySet>>,
    read_at: Option<Instant>,
    /// Counts the reads tried, so that a caller that waited for another's read does not read
    /// again.
    tries: u64,
    /// No read before this.
    not_before: Option<Instant>,
    failing: bool,
}

/// The keys held: the set, and the number of reads tried when it was taken, to ask for a
/// newer one with [`IssuerKeys::refresh`].
pub struct Held {
    pub keys: Option<Arc<KeySet>>,
    tries: u64,
}

/// The ServiceAccount issuer's keys, read through the apiserver.
#[derive(Clone)]
pub struct IssuerKeys {
    client: kube::Client,
    state: Arc<Mutex<State>>,
    /// One read at a time; callers that need one wait for the read under way.
    reading: Arc<tokio::sync::Mutex<()>>,
}

impl IssuerKeys {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            state: Arc::default(),
            reading: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The keys, read first when none are held or they are older than [`FRESH_FOR`] (and a
    /// read is due).
    pub async fn current(&self) -> Held {
        let now = Instant::now();
        let held = {
            let s = self.lock();
            let old = s.read_at.is_none_or(|at| now >= at + FRESH_FOR);
            let due = s.not_before.is_none_or(|t| now >= t);
            if !(old && due) {
                return Held {
                    keys: s.keys.clone(),
                    tries: s.tries,
                };
            }
            Held {
                keys: s.keys.clone(),
                tries: s.tries,
            }
        };
        self.refresh(&held).await
    }

    /// The keys read again, unless a read was tried since `held` was taken (then its result),
    /// or the last read was less than [`FETCH_EVERY`] ago (then the keys held).
    pub async fn refresh(&self, held: &Held) -> Held {
        let _reading = self.reading.lock().await;
        let now = Instant::now();
        {
            let mut s = self.lock();
            let read_since = held.tries != s.tries;
            if read_since || s.not_before.is_some_and(|t| now < t) {
                return Held {
                    keys: s.keys.clone(),
                    tries: s.tries,
                };
            }
            s.not_before = Some(now + FETCH_EVERY);
            s.tries += 1;
        }
        let read = match tokio::time::timeout(FETCH_TIMEOUT, self.read()).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {FETCH_TIMEOUT:?}")),
        };
        let mut s = self.lock();
        match read {
            Ok(keys) => {
                let (all, checked) = keys.counts();
                if s.failing || s.keys.as_deref() != Some(&keys) {
                    tracing::info!(
                        issuer = %keys.issuer,
                        keys = all,
                        checked,
                        "/metrics: ServiceAccount tokens of this issuer are checked against its keys before the apiserver is asked"
                    );
                }
                s.failing = false;
                s.keys = Some(Arc::new(keys));
                s.read_at = Some(now);
            }
            Err(error) => {
                if !s.failing {
                    tracing::warn!(
                        %error,
                        retry_after = ?FETCH_EVERY,
                        "/metrics: could not read the ServiceAccount issuer's keys; tokens are checked by the apiserver alone until they can be"
                    );
                } else {
                    tracing::debug!(%error, "/metrics: still could not read the ServiceAccount issuer's keys");
                }
                s.failing = true;
            }
        }
        Held {
            keys: s.keys.clone(),
            tries: s.tries,
        }
    }

    async fn read(&self) -> Result<KeySet, String> {
        let discovery = self.get(DISCOVERY_PATH).await?;
        let jwks = self.get(JWKS_PATH).await?;
        KeySet::parse(&discovery, &jwks)
    }

    /// The body of a GET of `path`, at most [`DOCUMENT_MAX`] bytes.
    async fn get(&self, path: &str) -> Result<Vec<u8>, String> {
        let request = Request::get(path)
            .header(
                http::header::ACCEPT,
                "application/json, application/jwk-set+json",
            )
            .body(Body::empty())
            .map_err(|e| e.to_string())?;
        let response = self
            .client
            .send(request)
            .await
            .map_err(|e| format!("GET {path}: {e}"))?;
        if response.status() != StatusCode::OK {
            return Err(format!("GET {path}: {}", response.status()));
        }
        let mut body = response.into_body();
        let mut out = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.map_err(|e| format!("GET {path}: {e}"))?;
            if let Some(data) = frame.data_ref() {
                if out.len() + data.len() > DOCUMENT_MAX {
                    return Err(format!("GET {path}: over {DOCUMENT_MAX} bytes"));
                }
                out.extend_from_slice(data);
            }
        }
        Ok(out)
    }
}
