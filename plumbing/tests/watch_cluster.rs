//! The watch primitive against a real kube-apiserver (`KUBE_APISERVER`): a quiet watch stays
//! healthy without relisting, and a watch that goes silent (a proxy that stops forwarding) is
//! failed, then re-watched from its last resourceVersion, not relisted, and catches up with
//! what changed meanwhile.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use groundskeeper_plumbing::{
    Readiness, WatchSettings,
    watch::cache::{Health, Projected, Shared, Stale, Store, follow_in},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt, api::PostParams, runtime::watcher};
use testkit::{proxy::Proxy, wait_for};

const SILENT_AFTER: Duration = Duration::from_secs(10);

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

fn lists(queries: &Mutex<Vec<String>>) -> usize {
    let q = queries.lock().unwrap();
    q.iter().filter(|q| !q.contains("watch=true")).count()
}

#[tokio::test]
async fn a_silent_watch_is_rewatched_from_its_version_and_catches_up_without_a_list()
-> anyhow::Result<()> {
    let name = "a_silent_watch_is_rewatched_from_its_version_and_catches_up_without_a_list";
    let Some(c) = testkit::cluster(name).await else {
        return Ok(());
    };
    let Some(apiserver) = testkit::proxy::apiserver_addr(&c.kubeconfig)? else {
        testkit::skipped(name, "the kubeconfig names the apiserver by host name");
        return Ok(());
    };
    let ns = c.namespace("silent-watch").await?;
    let proxy = Proxy::start(apiserver).await?;
    let via_proxy = testkit::proxy::kubeconfig_with_server(&c.kubeconfig, &proxy.url())?;
    let queries = Arc::new(Mutex::new(Vec::new()));
    let client = recording_client(&via_proxy, queries.clone()).await?;

    let readiness = Readiness::new(WatchSettings {
        silent_after: SILENT_AFTER,
        ..Default::default()
    });
    let cache: Shared<Store<String, ()>> = Shared::default();
    let ns_ = ns.clone();
    let (flag, stream) = follow_in(
        &readiness,
        "test",
        client,
        move |c| Api::<ConfigMap>::namespaced(c, &ns_),
        watcher::Config::default(),
        cache.clone(),
        |s, ev| s.apply_event(ev, |c: ConfigMap| Projected::Yes(c.name_any(), ())),
    );
    let driver = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    let health = Health::new([flag.clone()]);
    wait_for(Duration::from_secs(30), "the first list", || async {
        Ok(flag.is_healthy())
    })
    .await?;

    // Quiet (nobody writes ConfigMaps here, and this apiserver sends no bookmark then): the
    // watch ends every half bound and is watched again, heard, healthy, never relisted.
    testkit::holds_for(
        2 * SILENT_AFTER + Duration::from_secs(2),
        "a quiet watch stays healthy",
        || async { Ok(flag.is_healthy()) },
    )
    .await?;
    assert_eq!(
        lists(&queries),
        1,
        "a quiet watch relisted: {:?}",
        queries.lock().unwrap()
    );

    let seen = health.seen();
    proxy.freeze();
    wait_for(
        SILENT_AFTER + Duration::from_secs(5),
        "the watch to be failed as silent",
        || async { Ok(!flag.is_healthy()) },
    )
    .await?;
    assert_eq!(health.may_act(&seen), Err(Stale::NotHealthy));
    // Made while the watch hears nothing: the re-watch from the last version must replay it.
    let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), &ns);
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("made-while-silent".into());
    cms.create(&PostParams::default(), &cm).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !flag.is_healthy(),
        "still failed while nothing comes through"
    );
    assert_eq!(health.may_act(&health.seen()), Err(Stale::NotHealthy));

    proxy.resume();
    wait_for(
        Duration::from_secs(30),
        "healthy again with what was made meanwhile",
        || async {
            Ok(flag.is_healthy() && cache.lock().contains(&"made-while-silent".to_string()))
        },
    )
    .await?;
    assert_eq!(health.may_act(&seen), Err(Stale::ChangedSince));
    assert_eq!(health.may_act(&health.seen()), Ok(()));
    let q = queries.lock().unwrap().clone();
    assert_eq!(lists(&queries), 1, "re-watched, not relisted: {q:?}");
    driver.abort();
    Ok(())
}
