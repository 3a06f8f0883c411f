//! The start row: from a PodGC's process start to its first delete on every pod and node, and
//! the floor under it (what a bare client takes to list the same objects, consistently as
//! PodGC does, and from the watch cache at `resourceVersion=0`).
//!
//! Two finished pods wait in a namespace of their own, `first-0` created a second before
//! `first-1`; the PodGC runs with `--terminated-pod-gc-threshold=1`, so its first cycle, once
//! its caches are full, deletes `first-0` (the older one) and must leave `first-1`. Their GETs,
//! every 250 ms from the process start, see the delete.

use std::time::{Duration, Instant};

use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use testkit::figures::bench as figure;

use crate::objects::finished_status;

/// The flag that makes the two finished pods one too many.
pub(crate) const THRESHOLD_FLAG: &str = "--terminated-pod-gc-threshold=1";

const OLDER: &str = "first-0";
const YOUNGER: &str = "first-1";

/// The two finished pods, in `ns`.
pub(crate) struct FirstPods {
    api: Api<Pod>,
}

impl FirstPods {
    /// Creates (again) the two finished pods, `first-0` a second before `first-1`.
    pub(crate) async fn make(client: &Client, ns: &str) -> anyhow::Result<Self> {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        for name in [OLDER, YOUNGER] {
            let _ = api
                .delete(name, &kube::api::DeleteParams::default().grace_period(0))
                .await;
        }
        testkit::wait_for(Duration::from_secs(60), "old first pods gone", || async {
            Ok(api.get_opt(OLDER).await?.is_none() && api.get_opt(YOUNGER).await?.is_none())
        })
        .await?;
        for name in [OLDER, YOUNGER] {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "app", "image": "registry.example.com/team/x:v1"}]}
            }))?;
            api.create(&PostParams::default(), &pod).await?;
            api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(finished_status(Duration::from_secs(600))),
            )
            .await?;
            // creationTimestamp has seconds: the older one is older by one at least.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        Ok(Self { api })
    }

    /// Whether both are still there.
    pub(crate) async fn both_there(&self) -> anyhow::Result<bool> {
        Ok(self.api.get_opt(OLDER).await?.is_some() && self.api.get_opt(YOUNGER).await?.is_some())
    }

    /// Waits (up to `within`) for the first of the two to be deleted, from `started`: how long
    /// after it, and whether it was the older one with the younger one left.
    pub(crate) async fn first_delete(
        &self,
        started: Instant,
        within: Duration,
    ) -> anyhow::Result<(Duration, bool)> {
        loop {
            let (older, younger) = (
                self.api.get_opt(OLDER).await?,
                self.api.get_opt(YOUNGER).await?,
            );
            if older.is_none() || younger.is_none() {
                return Ok((started.elapsed(), older.is_none() && younger.is_some()));
            }
            anyhow::ensure!(
                started.elapsed() < within,
                "no first delete within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Prints and records a PodGC's start: `who` started at `started`, listed at `listed` (None
/// when it says nothing of it), first deleted at `first`.
pub(crate) fn print_start(
    who: &str,
    prefix: &str,
    size: &str,
    listed: Option<Duration>,
    (first, correct): (Duration, bool),
) -> anyhow::Result<()> {
    let listed = listed
        .map(|l| format!("caches listed after {:.1}s, ", l.as_secs_f64()))
        .unwrap_or_default();
    println!(
        "start row: {who}: {listed}first delete {:.1}s after the process started ({})",
        first.as_secs_f64(),
        if correct {
            "first-0, the older one; first-1 left"
        } else {
            "WRONG POD"
        }
    );
    anyhow::ensure!(correct, "start row: {who} deleted the wrong pod first");
    figure(
        &format!("{prefix}_start_to_first_delete_{size}_s"),
        first.as_secs_f64(),
        "s",
    );
    Ok(())
}

/// The floor: a bare client lists every pod (pages of 500, consistent: what PodGC asks) and
/// every node, reading the bytes and nothing more. Prints and records the time.
pub(crate) async fn floor(client: &Client, size: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    let (pods, pod_bytes) = list_all(client, "/api/v1/pods", "limit=500").await?;
    let (nodes, _) = list_all(client, "/api/v1/nodes", "limit=500").await?;
    let consistent = t.elapsed();
    println!(
        "start row: bare client: {pods} pods ({:.0} MiB of JSON) and {nodes} nodes listed in {:.1}s \
         (consistent, pages of 500)",
        pod_bytes as f64 / 1048576.0,
        consistent.as_secs_f64(),
    );
    figure(
        &format!("bare_list_consistent_{size}_s"),
        consistent.as_secs_f64(),
        "s",
    );
    Ok(())
}

/// What separates a PodGC's list from the floor, each a bare client listing the pods
/// consistently, one page after the other: JSON in PodGC's pages of 100 read and dropped (page
/// size alone); decoded into PodGC's own wire type (`ObjectList<WirePod>`) in pages of 100 (as
/// kube-runtime's watcher lists, and so PodGC) and of 500, and pipelined in pages of 100 (the
/// next page asked for as soon as this one's continue token is read, while this one is
/// decoded); and protobuf, what client-go's clients of built-in kinds ask for, in pages of 100
/// and of 500, read and dropped (the apiserver's side of it). Prints and records each.
pub(crate) async fn floor_variants(client: &Client, size: &str) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let t = Instant::now();
    let (pods, _) = list_all(client, "/api/v1/pods", "limit=100").await?;
    rows.push((
        (
            "consistent_pages_of_100",
            format!("{pods} pods, JSON read and dropped, pages of 100"),
        ),
        t.elapsed(),
    ));
    for (page, name) in [(100, "decoded"), (500, "decoded_pages_of_500")] {
        let t = Instant::now();
        let pods = list_decoded(client, page, false).await?;
        rows.push((
            (
                name,
                format!("{pods} pods decoded into PodGC's wire type, pages of {page}"),
            ),
            t.elapsed(),
        ));
    }
    let t = Instant::now();
    let pods = list_decoded(client, 100, true).await?;
    rows.push((
        (
            "decoded_pipelined",
            format!("{pods} pods decoded, pages of 100, the next asked for while one is decoded"),
        ),
        t.elapsed(),
    ));
    for (page, name) in [(100, "protobuf_pages_of_100"), (500, "protobuf")] {
        let t = Instant::now();
        let (pages, bytes) = list_protobuf(client, page).await?;
        rows.push((
            (
                name,
                format!(
                    "pods as protobuf, {pages} pages of {page}, {:.0} MiB read and dropped",
                    bytes as f64 / 1048576.0
                ),
            ),
            t.elapsed(),
        ));
    }
    for ((name, what), took) in rows {
        println!("start row: bare client: {what}: {:.1}s", took.as_secs_f64());
        figure(
            &format!("bare_list_{name}_{size}_s"),
            took.as_secs_f64(),
            "s",
        );
    }
    Ok(())
}

/// The pods, consistently in pages of `page`, each page's body read whole and decoded into
/// `ObjectList<WirePod>` (on a blocking thread, off the runtime's). `pipelined`: the next page
/// is requested as soon as this one's continue token is known, before this one is decoded.
async fn list_decoded(client: &Client, page: usize, pipelined: bool) -> anyhow::Result<usize> {
    use groundskeeper_controllers::podgc::wire::WirePod;
    let fetch = |token: Option<String>| {
        let client = client.clone();
        async move {
            let cont = token.map(|t| format!("&continue={t}")).unwrap_or_default();
            let req =
                http::Request::get(format!("/api/v1/pods?limit={page}{cont}")).body(Vec::new())?;
            let body = client.request_text(req).await?;
            anyhow::Ok(body)
        }
    };
    let decode = |body: String| {
        tokio::task::spawn_blocking(move || {
            let list: kube::core::ObjectList<WirePod> = serde_json::from_str(&body)?;
            anyhow::Ok((list.items.len(), list.metadata.continue_))
        })
    };
    let mut items = 0;
    let mut body = fetch(None).await?;
    loop {
        // The continue token is in the list's metadata, written before the items.
        let head = &body[..body.len().min(4096)];
        let token = head
            .split_once("\"continue\":\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(t, _)| t.to_string())
            .filter(|t| !t.is_empty());
        let next = match (&token, pipelined) {
            (Some(t), true) => Some(tokio::spawn(fetch(Some(t.clone())))),
            _ => None,
        };
        let (n, cont) = decode(body).await??;
        items += n;
        anyhow::ensure!(
            cont.filter(|c| !c.is_empty()) == token,
            "the continue token read ahead differs from the decoded one"
        );
        body = match (token, next) {
            (None, _) => return Ok(items),
            (Some(_), Some(next)) => next.await??,
            (Some(t), None) => fetch(Some(t)).await?,
        };
    }
}

/// The pods as protobuf (`application/vnd.kubernetes.protobuf`), consistently in pages of
/// `page`, each body read whole and only its continue token parsed: how many pages and bytes.
async fn list_protobuf(client: &Client, page: usize) -> anyhow::Result<(usize, usize)> {
    let (mut pages, mut bytes) = (0, 0);
    let mut token: Option<String> = None;
    loop {
        let cont = token
            .as_deref()
            .map(|t| format!("&continue={t}"))
            .unwrap_or_default();
        let req = http::Request::get(format!("/api/v1/pods?limit={page}{cont}"))
            .header(http::header::ACCEPT, "application/vnd.kubernetes.protobuf")
            .body(Vec::new())?;
        let mut body = Box::pin(client.request_stream(req).await?);
        let mut all = Vec::new();
        body.read_to_end(&mut all).await?;
        pages += 1;
        bytes += all.len();
        token = protobuf_continue(&all)?.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok((pages, bytes));
        }
    }
}

/// The continue token of a protobuf list: after the magic `k8s\0`, a `runtime.Unknown` whose
/// field 2 (`raw`) is the list, whose field 1 is its `ListMeta`, whose field 3 is `continue`.
fn protobuf_continue(body: &[u8]) -> anyhow::Result<Option<String>> {
    let msg = body.strip_prefix(b"k8s\0").ok_or_else(|| {
        anyhow::anyhow!("not a protobuf answer: {:?}", &body[..body.len().min(64)])
    })?;
    let Some(list) = protobuf_field(msg, 2)? else {
        return Ok(None);
    };
    let Some(meta) = protobuf_field(list, 1)? else {
        return Ok(None);
    };
    Ok(protobuf_field(meta, 3)?.map(|t| String::from_utf8_lossy(t).into_owned()))
}

/// The first length-delimited field `want` of the protobuf message `msg`.
fn protobuf_field(mut msg: &[u8], want: u64) -> anyhow::Result<Option<&[u8]>> {
    fn varint(b: &mut &[u8]) -> anyhow::Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b
                .split_first()
                .ok_or_else(|| anyhow::anyhow!("truncated varint"))?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        anyhow::bail!("varint too long")
    }
    while !msg.is_empty() {
        let key = varint(&mut msg)?;
        let (field, wire) = (key >> 3, key & 7);
        let len = match wire {
            0 => {
                varint(&mut msg)?;
                continue;
            }
            1 => 8,
            2 => varint(&mut msg)? as usize,
            5 => 4,
            w => anyhow::bail!("protobuf wire type {w}"),
        };
        anyhow::ensure!(len <= msg.len(), "truncated field");
        let (value, rest) = msg.split_at(len);
        if wire == 2 && field == want {
            return Ok(Some(value));
        }
        msg = rest;
    }
    Ok(None)
}

/// What a list from the apiserver's watch cache would take: the pods at `resourceVersion=0`
/// (one answer, the whole list). Last in the row: that answer swells the apiserver's heap by
/// its size, and what is measured after it would wait on the apiserver's garbage collection.
pub(crate) async fn from_watch_cache(client: &Client, size: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    let (pods, bytes) = list_all(client, "/api/v1/pods", "resourceVersion=0").await?;
    let cached = t.elapsed();
    println!(
        "start row: bare client: {pods} pods at resourceVersion=0 (the apiserver's watch cache, \
         one answer, {:.0} MiB) in {:.1}s",
        bytes as f64 / 1048576.0,
        cached.as_secs_f64()
    );
    figure(
        &format!("bare_list_rv0_pods_{size}_s"),
        cached.as_secs_f64(),
        "s",
    );
    Ok(())
}

/// Lists `path` page by page (`query` on every request, `continue` added), reading each body
/// as it streams in: how many items (each bench pod and node has one `"uid":"`, so their
/// count) and how many bytes.
async fn list_all(client: &Client, path: &str, query: &str) -> anyhow::Result<(usize, usize)> {
    let (mut items, mut bytes) = (0usize, 0usize);
    let mut token: Option<String> = None;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let cont = token
            .as_deref()
            .map(|t| format!("&continue={t}"))
            .unwrap_or_default();
        let req = http::Request::get(format!("{path}?{query}{cont}")).body(Vec::new())?;
        let mut body = Box::pin(client.request_stream(req).await?);
        // The continue token is in the list's metadata, which the apiserver writes before the
        // items: the head is kept, and of the rest only what a key may straddle.
        let (mut head, mut carry) = (Vec::new(), Vec::new());
        loop {
            let n = body.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            bytes += n;
            if head.len() < 4096 {
                head.extend_from_slice(&chunk[..n.min(4096 - head.len())]);
            }
            carry.extend_from_slice(chunk);
            items += carry.windows(7).filter(|w| w == b"\"uid\":\"").count();
            let keep = carry.len().saturating_sub(6);
            carry.drain(..keep);
        }
        let head = String::from_utf8_lossy(&head);
        token = head
            .split_once("\"continue\":\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(t, _)| t.to_string())
            .filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok((items, bytes));
        }
    }
}
