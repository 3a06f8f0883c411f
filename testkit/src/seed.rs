//! Seeding a bench's objects straight into its own etcd, as copies of one the apiserver stored.
//!
//! On 2 shared cores the apiserver creates a few dozen to a few hundred objects a second: 150k
//! pods take over 20 minutes, 50k Services (100k IPAddresses) about 45. A copy of what the
//! apiserver stored for one object (defaults, managedFields and all), with its own name and UID,
//! written to etcd is what the apiserver would have stored, and it serves it like any other
//! (it decodes JSON from etcd as well as protobuf). Only with a control plane of the bench's own.

use std::time::{Duration, Instant};

use kube::Client;
use serde_json::Value;

use crate::{ControlPlane, wait_for};

/// A UID of its own for the `i`th copy of kind `kind` (a number the caller picks per kind, so
/// two kinds seeded by one process never share one), of this process.
pub fn uid(kind: u16, i: usize) -> String {
    format!("{:08x}-{kind:04x}-4000-8000-{:012x}", std::process::id(), i)
}

/// Now, as `metadata.creationTimestamp` reads (whole seconds, UTC): for copies whose age
/// matters (the apiserver's IP repair loop deletes an allocator's IPAddress without a Service
/// once it is 60 s old).
pub fn created_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// What the apiserver stored at `path` (a GET), `resourceVersion` dropped (etcd's revision is
/// it): the template copies are made from.
pub async fn stored(client: &Client, path: &str) -> anyhow::Result<Value> {
    let req = http::Request::get(path).body(Vec::new())?;
    let mut v: Value = serde_json::from_str(&client.request_text(req).await?)?;
    v["metadata"]
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("{path}: no metadata"))?
        .remove("resourceVersion");
    Ok(v)
}

/// Creates `body` in the collection at `path` (already there is fine); the answer is not
/// decoded.
pub async fn post(client: &Client, path: &str, body: &Value) -> anyhow::Result<()> {
    let req = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(body)?)?;
    match client.request_text(req).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How many objects the apiserver lists at `path` (a page of one and the remaining count).
pub async fn served(client: &Client, path: &str) -> anyhow::Result<u64> {
    let sep = if path.contains('?') { '&' } else { '?' };
    let req = http::Request::get(format!("{path}{sep}limit=1")).body(Vec::new())?;
    let list: Value = serde_json::from_str(&client.request_text(req).await?)?;
    let items = list["items"].as_array().map_or(0, Vec::len) as u64;
    Ok(items + list["metadata"]["remainingItemCount"].as_u64().unwrap_or(0))
}

/// Fails unless etcd holds `key`: a template's key read back, so a wrong key prefix fails the
/// bench here rather than seeding objects the apiserver never sees.
pub fn ensure_key(cp: &ControlPlane, key: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        cp.etcd_has(key)?,
        "etcd has no {key}: the key prefix does not match where the apiserver stores this kind"
    );
    Ok(())
}

/// Writes `item(0)`..`item(n-1)`, each an etcd `(key, stored JSON)`, `threads` at a time and
/// `txn_ops` to a transaction (see [`ControlPlane::etcd_put_in_txns`]), then waits until the
/// apiserver lists at least `count` objects at each `(list path, count)`. Returns the seconds
/// the writes took and the seconds until everything was served.
pub async fn put_and_wait(
    client: &Client,
    cp: &ControlPlane,
    (n, threads, txn_ops): (usize, usize, usize),
    item: impl Fn(usize) -> (String, Vec<u8>) + Sync,
    want: &[(&str, u64)],
) -> anyhow::Result<(f64, f64)> {
    let start = Instant::now();
    tokio::task::block_in_place(|| cp.etcd_put_in_txns(n, threads, txn_ops, item))?;
    let written = start.elapsed().as_secs_f64();
    for (path, count) in want {
        wait_for(
            Duration::from_secs(600),
            "the apiserver serves every seeded object",
            || async { Ok(served(client, path).await? >= *count) },
        )
        .await?;
    }
    Ok((written, start.elapsed().as_secs_f64()))
}

/// One kind seeded from its first object: where it lives and how many.
pub struct Kind<'a> {
    /// What the printed line calls them (`pods`).
    pub what: &'a str,
    /// The collection's API path (`/api/v1/namespaces/x/pods`).
    pub api_path: &'a str,
    /// Its etcd key prefix (`/registry/pods/x`); a copy's key is `<prefix>/<name>`.
    pub etcd_prefix: &'a str,
    /// The number for [`uid`] (one per kind in a process).
    pub uid_kind: u16,
    /// How many in all, the first included.
    pub n: usize,
    pub threads: usize,
}

/// Creates `first` through the apiserver, then the other `n - 1` straight into etcd as copies
/// of what the apiserver stored for it, each with its own UID and `vary(i, copy)` applied (`i`
/// from 1; `vary` sets the name). Returns the seconds until the apiserver serves all of them.
pub async fn seed<V>(
    client: &Client,
    cp: &ControlPlane,
    kind: Kind<'_>,
    first: Value,
    vary: V,
) -> anyhow::Result<f64>
where
    V: Fn(usize, &mut Value) + Sync,
{
    let start = Instant::now();
    let name0 = first["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("the first {} has no name", kind.what))?
        .to_string();
    post(client, kind.api_path, &first).await?;
    let template = stored(client, &format!("{}/{name0}", kind.api_path)).await?;
    ensure_key(cp, &format!("{}/{name0}", kind.etcd_prefix))?;
    let put = |i: usize| {
        let mut v = template.clone();
        vary(i + 1, &mut v);
        v["metadata"]["uid"] = uid(kind.uid_kind, i + 1).into();
        let name = v["metadata"]["name"].as_str().expect("named").to_string();
        (
            format!("{}/{name}", kind.etcd_prefix),
            serde_json::to_vec(&v).expect("json"),
        )
    };
    let want = [(kind.api_path, kind.n as u64)];
    // 128 to a transaction (etcd 3.4's most): nothing watches pods or nodes while they are
    // written but the apiserver's caches, which do not restart their watches.
    let batch = (kind.n.saturating_sub(1), kind.threads, 128);
    let (written, _) = put_and_wait(client, cp, batch, put, &want).await?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "seeded {} {} in {secs:.1}s ({:.0}/s; the first through the apiserver, the rest written to etcd in {written:.1}s as copies of it)",
        kind.n,
        kind.what,
        kind.n as f64 / secs
    );
    Ok(secs)
}
