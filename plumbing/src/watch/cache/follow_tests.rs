//! The store's buffered relist and projection, and `follow`: each event handed on only after
//! the store has applied it, ready once listed.

use super::*;

#[test]
fn relist_replaces_and_drops_what_is_gone() {
    let mut s: Store<&str, u32> = Store::default();
    assert!(!s.listed());
    s.apply(Update::Init);
    s.apply(Update::InitApply("a", 1));
    s.apply(Update::InitApply("b", 1));
    assert!(s.is_empty(), "nothing visible before the list completes");
    assert_eq!(
        s.apply(Update::InitDone),
        Applied::Relisted {
            old: HashMap::new()
        }
    );
    assert!(s.listed());
    assert_eq!(
        s.apply(Update::Apply("c", 1)),
        Applied::Upserted {
            key: "c",
            old: None
        }
    );
    assert_eq!(
        s.apply(Update::Delete("a")),
        Applied::Removed { key: "a", old: 1 }
    );
    assert_eq!(s.apply(Update::Delete("a")), Applied::Nothing, "unknown");
    // The watch breaks; the relist no longer has b.
    s.apply(Update::Init);
    s.apply(Update::InitApply("c", 2));
    let mut mid: Vec<_> = s.iter().map(|(k, v)| (*k, *v)).collect();
    mid.sort();
    assert_eq!(
        mid,
        [("b", 1), ("c", 1)],
        "the old list stays until InitDone"
    );
    let Applied::Relisted { old } = s.apply(Update::InitDone) else {
        panic!("not a relist")
    };
    assert_eq!(old, HashMap::from([("b", 1), ("c", 1)]));
    let after: Vec<_> = s.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(after, [("c", 2)]);
}

#[test]
fn an_object_that_stops_being_kept_leaves_the_store() {
    let project = |n: (&'static str, u32)| {
        if n.1 == 0 {
            Projected::No(n.0)
        } else if n.0.is_empty() {
            Projected::Unusable
        } else {
            Projected::Yes(n.0, n.1)
        }
    };
    let mut s: Store<&str, u32> = Store::default();
    s.apply_event(Event::Init, project);
    s.apply_event(Event::InitApply(("a", 1)), project);
    s.apply_event(Event::InitApply(("b", 0)), project);
    s.apply_event(Event::InitApply(("", 3)), project);
    s.apply_event(Event::InitDone, project);
    assert_eq!(s.len(), 1, "only a is kept");
    assert_eq!(
        s.apply_event(Event::Apply(("a", 0)), project),
        Applied::Removed { key: "a", old: 1 }
    );
    assert_eq!(
        s.apply_event(Event::Apply(("", 5)), project),
        Applied::Nothing
    );
    assert_eq!(
        s.apply_event(Event::Delete(("b", 0)), project),
        Applied::Nothing
    );
    assert!(s.is_empty());
}

#[tokio::test]
async fn follow_folds_before_it_yields_and_is_ready_once_listed() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    let service = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
        let body = if req.uri().query().is_some_and(|q| q.contains("watch=true")) {
            std::future::pending::<()>().await;
            unreachable!()
        } else {
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
                "metadata": {"resourceVersion": "1"},
                "items": [{"metadata": {"name": "a", "namespace": "default",
                                        "resourceVersion": "1"}}]})
            .to_string()
        };
        Ok::<_, std::convert::Infallible>(
            http::Response::builder()
                .status(200)
                .body(kube::client::Body::from(body.into_bytes()))
                .unwrap(),
        )
    });
    let client = kube::Client::new(service, "default");
    // The fake apiserver serves paged lists only.
    let readiness = Readiness::new(crate::WatchSettings {
        list: crate::watch::list::WatchList::Off,
        ..Default::default()
    });
    let cache: Shared<Store<String, ()>> = Shared::default();
    let (flag, stream) = follow(
        &readiness,
        "test",
        client,
        watcher::Config::default(),
        cache.clone(),
        |s, ev| s.apply_event(ev, |c: ConfigMap| Projected::Yes(c.name_any(), ())),
    );
    assert_eq!(flag.name(), "test/configmaps");
    let mut stream = std::pin::pin!(stream);
    loop {
        let applied = stream.next().await.unwrap();
        if applied.is_relisted() {
            break;
        }
        assert!(!flag.is_ready(), "not before the list is folded in");
    }
    assert!(flag.is_ready() && flag.is_healthy());
    assert!(cache.lock().contains(&"a".to_string()));
}
