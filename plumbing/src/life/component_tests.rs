//! A component's life: nothing acts before the first list and the gate, the drain goes in its
//! order, and a worker or watch that ends early fails the component.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::component::{Crew, Life, Work};
use crate::watch::cache::Health;
use crate::{Readiness, WatchSettings};

type Log = Arc<Mutex<Vec<String>>>;

fn note(log: &Log, what: impl Into<String>) {
    log.lock().unwrap().push(what.into());
}

fn seen(log: &Log) -> Vec<String> {
    log.lock().unwrap().clone()
}

/// A worker that takes keys off a channel until it is closed, slowly enough that a drain has
/// work in flight to wait for.
struct Keys {
    rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<u32>>,
    log: Log,
}

impl Work for Keys {
    async fn process_next(&self) -> bool {
        let Some(k) = self.rx.lock().await.recv().await else {
            note(&self.log, "worker: no more");
            return false;
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        note(&self.log, format!("worker: done {k}"));
        true
    }
}

/// Watches that never end by themselves, and say when they are stopped.
fn watches(log: &Log) -> impl Future<Output = ()> + Send + 'static {
    struct Stopped(Log);
    impl Drop for Stopped {
        fn drop(&mut self) {
            note(&self.0, "watches: stopped");
        }
    }
    let stopped = Stopped(log.clone());
    async move {
        let _stopped = stopped;
        std::future::pending::<()>().await
    }
}

#[tokio::test(start_paused = true)]
async fn the_crew_starts_only_after_the_first_list_and_the_gate() {
    let token = CancellationToken::new();
    let log = Log::default();
    let listed = Arc::new(Notify::new());
    let gate = Arc::new(Notify::new());
    let started = Arc::new(AtomicUsize::new(0));
    let mut life = Life::new("test", token.clone()).gated({
        let gate = gate.clone();
        async move { gate.notified().await }
    });
    life.watches(watches(&log));
    let run = tokio::spawn({
        let (listed, started) = (listed.clone(), started.clone());
        life.run(async move { listed.notified().await }, move || {
            started.fetch_add(1, Ordering::SeqCst);
            Crew::default()
        })
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(started.load(Ordering::SeqCst), 0, "started before listing");
    // The gate alone (leadership won before the caches listed) starts nothing.
    gate.notify_one();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(started.load(Ordering::SeqCst), 0, "started before listing");
    listed.notify_one();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(started.load(Ordering::SeqCst), 1);
    token.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(seen(&log), ["watches: stopped"]);
}

#[tokio::test(start_paused = true)]
async fn listed_but_never_leading_never_starts_and_drains_clean() {
    let token = CancellationToken::new();
    let log = Log::default();
    let mut life = Life::new("test", token.clone()).gated(std::future::pending());
    life.watches(watches(&log));
    let run = tokio::spawn(life.run(async {}, || panic!("a standby started its crew")));
    tokio::time::sleep(Duration::from_secs(600)).await;
    token.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(seen(&log), ["watches: stopped"]);
}

#[tokio::test(start_paused = true)]
async fn the_drain_stops_the_crew_then_waits_for_its_work_then_the_watches() {
    let token = CancellationToken::new();
    let log = Log::default();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut life = Life::new("test", token.clone());
    life.watches(watches(&log));
    let worker = Arc::new(Keys {
        rx: tokio::sync::Mutex::new(rx),
        log: log.clone(),
    });
    let tx = Arc::new(Mutex::new(Some(tx)));
    let sender = tx.lock().unwrap().clone().unwrap();
    let run = tokio::spawn({
        let (log, tx) = (log.clone(), tx.clone());
        life.run(async {}, move || {
            Crew::default().workers(1, worker).on_stop(move || {
                note(&log, "stop");
                tx.lock().unwrap().take();
            })
        })
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    sender.send(1).unwrap();
    sender.send(2).unwrap();
    drop(sender);
    tokio::time::sleep(Duration::from_millis(150)).await;
    // 1 is done, 2 is in flight when the token is cancelled.
    token.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(
        seen(&log),
        [
            "worker: done 1",
            "stop",
            "worker: done 2",
            "worker: no more",
            "watches: stopped"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_ends_early_fails_the_component_and_stops_its_watches() {
    let token = CancellationToken::new();
    let log = Log::default();
    let mut life = Life::new("servicecidr", token.clone());
    life.watches(watches(&log));
    let e = life
        .run(async {}, || {
            Crew::default().task(async { panic!("a bug in a worker") })
        })
        .await
        .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("servicecidr") && msg.contains("worker"),
        "{msg}"
    );
    assert!(
        !token.is_cancelled(),
        "the life does not cancel its own token"
    );
    assert_eq!(seen(&log), ["watches: stopped"]);
}

#[tokio::test(start_paused = true)]
async fn watches_that_end_early_fail_the_component_before_and_after_it_starts() {
    for listed in [false, true] {
        let token = CancellationToken::new();
        let mut life = Life::new("podgc", token.clone());
        life.watches(async { tokio::time::sleep(Duration::from_secs(5)).await });
        let listed = async move {
            if !listed {
                std::future::pending::<()>().await
            }
        };
        let e = life
            .run(listed, || Crew::default().task(std::future::pending()))
            .await
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("podgc: its watches ended"),
            "{e:#}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_feeder_says_listed_only_after_the_list_that_completes_it_was_handed_over() {
    let readiness = Readiness::new(WatchSettings::default());
    let (a, b) = (readiness.register("c/a"), readiness.register("c/b"));
    let health = Health::new([a.clone(), b.clone()]);
    let (tx, rx) = mpsc::unbounded_channel::<u32>();
    let queued = Arc::new(Mutex::new(Vec::new()));
    let token = CancellationToken::new();
    let mut life = Life::new("test", token.clone());
    let listed = life.feed(tokio_stream_of(rx), health, {
        let queued = queued.clone();
        move |k| queued.lock().unwrap().push(k)
    });
    let at_start = Arc::new(Mutex::new(None));
    let run = tokio::spawn({
        let (queued, at_start) = (queued.clone(), at_start.clone());
        life.run(listed.wait(), move || {
            *at_start.lock().unwrap() = Some(queued.lock().unwrap().clone());
            Crew::default()
        })
    });
    tx.send(1).unwrap();
    a.mark_ready();
    tx.send(2).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(*at_start.lock().unwrap(), None, "one watch has not listed");
    b.mark_ready();
    tx.send(3).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(*at_start.lock().unwrap(), Some(vec![1, 2, 3]));
    token.cancel();
    run.await.unwrap().unwrap();
    // The feeder was stopped with the life.
    assert!(tx.send(4).is_err() || queued.lock().unwrap().len() == 3);
}

fn tokio_stream_of(mut rx: mpsc::UnboundedReceiver<u32>) -> impl futures::Stream<Item = u32> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
