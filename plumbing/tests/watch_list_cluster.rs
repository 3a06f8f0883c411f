//! Streamed lists (`--watch-list`) against a real kube-apiserver (`KUBE_APISERVER`): with
//! `auto` the cache holds what a paged list holds, whether the server streams the list or not
//! (then the watch falls back to pages, once, counted); with `on` a server that cannot stream
//! keeps the cache not ready. An apiserver on an etcd that cannot be asked for progress (3.4 here)
//! ends every streamed list with a 500 "RequestWatchProgress is disabled"; one with the
//! WatchList feature gate off refuses it with a 422.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use groundskeeper_plumbing::{
    Readiness, ReadyFlag, WatchSettings,
    watch::cache::{Projected, Shared, Store, follow_in},
    watch::list::WatchList,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, PostParams, WatchEvent},
    runtime::watcher,
};
use testkit::wait_for;

const N: usize = 200;

/// A client through `kubeconfig` that records the query of every request it sends.
async fn recording_client(
    kubeconfig: &std::path::Path,
    queries: Arc<Mutex<Vec<String>>>,
) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let inner = kube::Client::try_from(config)?;
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let query = req.uri().query().unwrap_or_default().to_string();
        queries.lock().unwrap().push(query);
        let inner = inner.clone();
        async move { inner.send(req).await }
    });
    Ok(kube::Client::new(service, "default"))
}

/// Whether the server streams a list: the first thing a streamed list of ConfigMaps in `ns`
/// brings is not an error.
async fn streams_lists(client: &kube::Client, ns: &str) -> anyhow::Result<bool> {
    let uri = format!(
        "/api/v1/namespaces/{ns}/configmaps?watch=true&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=10"
    );
    let req = http::Request::get(uri).body(Vec::new())?;
    let Ok(events) = client.request_events::<ConfigMap>(req).await else {
        return Ok(false);
    };
    let first = std::pin::pin!(events).next().await;
    Ok(matches!(first, Some(Ok(ev)) if !matches!(ev, WatchEvent::Error(_))))
}

fn fallbacks(registry: &prometheus::Registry) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == "groundskeeper_watch_list_fallbacks_total")
        .flat_map(|f| {
            f.get_metric()
                .iter()
                .map(|m| m.get_counter().get_value() as u64)
        })
        .sum()
}

async fn create(api: &Api<ConfigMap>, name: &str) -> anyhow::Result<()> {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    api.create(&PostParams::default(), &cm).await?;
    Ok(())
}

async fn paged_names(api: &Api<ConfigMap>) -> anyhow::Result<BTreeSet<String>> {
    let list = api.list(&ListParams::default()).await?;
    Ok(list.items.iter().map(|c| c.name_any()).collect())
}

struct Followed {
    flag: ReadyFlag,
    cache: Shared<Store<String, ()>>,
    registry: prometheus::Registry,
    driver: tokio::task::JoinHandle<()>,
}

impl Followed {
    fn names(&self) -> BTreeSet<String> {
        self.cache.lock().keys().cloned().collect()
    }
}

fn follow(client: kube::Client, ns: &str, mode: WatchList) -> Followed {
    let readiness = Readiness::new(WatchSettings {
        list: mode,
        list_timeout: Duration::from_secs(10),
        ..Default::default()
    });
    let registry = prometheus::Registry::new();
    registry.register(readiness.collector()).unwrap();
    let cache: Shared<Store<String, ()>> = Shared::default();
    let ns = ns.to_string();
    let (flag, stream) = follow_in(
        &readiness,
        "test",
        client,
        move |c| Api::<ConfigMap>::namespaced(c, &ns),
        // Consistent lists, as PodGC asks for them.
        watcher::Config::default(),
        cache.clone(),
        |s, ev| s.apply_event(ev, |c: ConfigMap| Projected::Yes(c.name_any(), ())),
    );
    let driver = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    Followed {
        flag,
        cache,
        registry,
        driver,
    }
}

/// `auto`: the cache holds all N, then live events, and deletions made while it lists are not
/// lost, streamed or not; a server that cannot stream costs one fallback, then paged lists.
#[tokio::test(flavor = "multi_thread")]
async fn auto_lists_everything_streamed_or_paged_and_loses_no_deletion() -> anyhow::Result<()> {
    let name = "auto_lists_everything_streamed_or_paged_and_loses_no_deletion";
    let Some(c) = testkit::cluster(name).await else {
        return Ok(());
    };
    auto_lists(&c, None).await
}

/// The variable naming an etcd the apiserver can ask for progress (3.5.13 or later; `.ci/run`
/// fetches Debian 13's): there the list must be streamed, never paged.
const ETCD_WITH_PROGRESS: &str = "KUBE_ETCD_PROGRESS";

/// On an etcd that answers progress requests the apiserver streams the list: `auto` streams
/// it, falls back nowhere and lists no page, and still loses no deletion.
#[tokio::test(flavor = "multi_thread")]
async fn auto_streams_the_list_on_an_etcd_that_answers_progress_requests() -> anyhow::Result<()> {
    let name = "auto_streams_the_list_on_an_etcd_that_answers_progress_requests";
    let Some(etcd) = std::env::var_os(ETCD_WITH_PROGRESS).filter(|v| !v.is_empty()) else {
        testkit::skipped(
            name,
            &format!("{ETCD_WITH_PROGRESS} names no etcd 3.5.13+ (see docs/testing.md)"),
        );
        return Ok(());
    };
    let Some((c, _cp)) = testkit::private_cluster_on(name, Some(etcd.into()), &[]).await else {
        return Ok(());
    };
    auto_lists(&c, Some(true)).await
}

/// `auto` against `c`: everything listed, deletions made while it lists not lost, live events
/// after. `streams`: whether the server must stream the list (`None`: as it says it does).
async fn auto_lists(c: &testkit::Cluster, streams: Option<bool>) -> anyhow::Result<()> {
    let ns = c.namespace("watch-list-auto").await?;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    for i in 0..N {
        create(&api, &format!("cm-{i}")).await?;
    }
    let offered = streams_lists(&c.client, &ns).await?;
    if let Some(must) = streams {
        assert_eq!(offered, must, "whether this apiserver streams a list");
    }
    let streams = offered;
    let queries = Arc::new(Mutex::new(Vec::new()));
    let client = recording_client(&c.kubeconfig, queries.clone()).await?;
    let f = follow(client, &ns, WatchList::Auto);
    // Deleted while the watch lists (or right after): gone from the cache all the same.
    for i in 0..10 {
        api.delete(&format!("cm-{i}"), &DeleteParams::default())
            .await?;
    }
    wait_for(Duration::from_secs(60), "the first list", || async {
        Ok(f.flag.is_healthy())
    })
    .await?;
    wait_for(
        Duration::from_secs(10),
        "the cache to match a paged list",
        || async { Ok(f.names() == paged_names(&api).await?) },
    )
    .await?;

    create(&api, "late").await?;
    api.delete("cm-10", &DeleteParams::default()).await?;
    wait_for(Duration::from_secs(10), "live events", || async {
        Ok(f.names().contains("late") && !f.names().contains("cm-10"))
    })
    .await?;
    assert_eq!(f.names(), paged_names(&api).await?);

    let q = queries.lock().unwrap().clone();
    let lists = q.iter().filter(|q| !q.contains("watch=true")).count();
    assert!(
        q[0].contains("sendInitialEvents=true") && !q[0].contains("resourceVersion=0"),
        "a consistent stream asked for first: {q:?}"
    );
    if streams {
        assert_eq!(fallbacks(&f.registry), 0, "{q:?}");
        assert_eq!(lists, 0, "streamed, never paged: {q:?}");
    } else {
        // This server cannot stream (etcd without progress requests): one fallback, then
        // lists in pages and watches without sendInitialEvents.
        assert_eq!(fallbacks(&f.registry), 1, "{q:?}");
        assert!(lists >= 1, "{q:?}");
        let streamed = q.iter().filter(|q| q.contains("sendInitialEvents")).count();
        assert_eq!(streamed, 1, "streams asked for after the fallback: {q:?}");
    }
    assert!(f.flag.is_healthy());
    f.driver.abort();
    Ok(())
}

/// The WatchList feature gate off: the apiserver refuses the stream (422). `auto` falls back
/// and lists everything; `on` reports the error and its cache stays not ready.
#[tokio::test(flavor = "multi_thread")]
async fn gate_off_auto_falls_back_and_on_stays_not_ready() -> anyhow::Result<()> {
    let name = "gate_off_auto_falls_back_and_on_stays_not_ready";
    let Some((c, cp)) = testkit::private_cluster(name).await else {
        return Ok(());
    };
    cp.set_apiserver_args(&["--feature-gates=WatchList=false"]);
    let restart = {
        let cp = &*cp;
        tokio::task::block_in_place(|| cp.restart_apiserver())
    };
    restart?;
    let ns = c.namespace("watch-list-gate-off").await?;
    let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    for i in 0..20 {
        create(&api, &format!("cm-{i}")).await?;
    }
    assert!(!streams_lists(&c.client, &ns).await?);

    let auto = follow(c.client.clone(), &ns, WatchList::Auto);
    let on = follow(c.client.clone(), &ns, WatchList::On);
    wait_for(Duration::from_secs(30), "auto to list", || async {
        Ok(auto.flag.is_healthy())
    })
    .await?;
    assert_eq!(auto.names(), paged_names(&api).await?);
    assert_eq!(fallbacks(&auto.registry), 1);

    testkit::holds_for(Duration::from_secs(5), "on stays not ready", || async {
        Ok(!on.flag.is_ready() && on.names().is_empty())
    })
    .await?;
    let errors: f64 = on
        .registry
        .gather()
        .iter()
        .filter(|f| f.name() == "groundskeeper_watch_errors_total")
        .flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().get_value()))
        .sum();
    assert!(errors >= 1.0, "the refusal is an error");
    assert_eq!(fallbacks(&on.registry), 0);
    auto.driver.abort();
    on.driver.abort();
    drop(c);
    Ok(())
}
