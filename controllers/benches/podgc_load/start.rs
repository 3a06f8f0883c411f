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
         (consistent, pages of 500: served from etcd here)",
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

/// The page size PodGC lists in (`podgc::cache`'s).
const PODGC_PAGE: &str = "limit=100";

/// What decoding adds to the floor, two ways, each a bare client listing the pods consistently
/// in PodGC's pages of 100 and decoding every page into PodGC's own wire type
/// (`ObjectList<WirePod>`): one page after the other, decoded before the next is asked for (as
/// kube-runtime's watcher lists, and so PodGC), and pipelined (the next page asked for as soon
/// as this one's continue token is read, while this one is decoded). Prints and records both.
pub(crate) async fn floor_decoded(client: &Client, size: &str) -> anyhow::Result<()> {
    let t = Instant::now();
    let serial = list_decoded(client, false).await?;
    let serial_s = t.elapsed();
    let t = Instant::now();
    let pipelined = list_decoded(client, true).await?;
    let pipelined_s = t.elapsed();
    println!(
        "start row: bare client: {serial} pods listed and decoded into PodGC's wire type in pages of 100 in {:.1}s \
         one page after the other; {pipelined} in {:.1}s with the next page asked for while one is decoded",
        serial_s.as_secs_f64(),
        pipelined_s.as_secs_f64(),
    );
    figure(
        &format!("bare_list_decoded_serial_{size}_s"),
        serial_s.as_secs_f64(),
        "s",
    );
    figure(
        &format!("bare_list_decoded_pipelined_{size}_s"),
        pipelined_s.as_secs_f64(),
        "s",
    );
    Ok(())
}

/// The pods, consistently in pages of 100, each page's body read whole and decoded into
/// `ObjectList<WirePod>` (on a blocking thread, off the runtime's). `pipelined`: the next page
/// is requested as soon as this one's continue token is known, before this one is decoded.
async fn list_decoded(client: &Client, pipelined: bool) -> anyhow::Result<usize> {
    use groundskeeper_controllers::podgc::wire::WirePod;
    let fetch = |token: Option<String>| {
        let client = client.clone();
        async move {
            let cont = token.map(|t| format!("&continue={t}")).unwrap_or_default();
            let req =
                http::Request::get(format!("/api/v1/pods?{PODGC_PAGE}{cont}")).body(Vec::new())?;
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
    let mut page = fetch(None).await?;
    loop {
        // The continue token is in the list's metadata, written before the items.
        let head = &page[..page.len().min(4096)];
        let token = head
            .split_once("\"continue\":\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(t, _)| t.to_string())
            .filter(|t| !t.is_empty());
        let next = match (&token, pipelined) {
            (Some(t), true) => Some(tokio::spawn(fetch(Some(t.clone())))),
            _ => None,
        };
        let (n, cont) = decode(page).await??;
        items += n;
        anyhow::ensure!(
            cont.filter(|c| !c.is_empty()) == token,
            "the continue token read ahead differs from the decoded one"
        );
        page = match (token, next) {
            (None, _) => return Ok(items),
            (Some(_), Some(next)) => next.await??,
            (Some(t), None) => fetch(Some(t)).await?,
        };
    }
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
