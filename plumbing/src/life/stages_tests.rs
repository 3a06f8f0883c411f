//! The process's stages: drained one after another in their order, each within the grace,
//! and a task that ends on its own is the failure returned.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::stages::{Stage, Stages};

type Log = Arc<Mutex<Vec<String>>>;

/// A stage with one task that, once its token is cancelled, takes `takes` to finish.
fn stage(name: &'static str, takes: Duration, log: &Log) -> Stage {
    let mut s = Stage::new(name);
    let (token, log) = (s.token(), log.clone());
    s.tasks().spawn(name, async move {
        token.cancelled().await;
        log.lock().unwrap().push(format!("{name}: cancelled"));
        tokio::time::sleep(takes).await;
        log.lock().unwrap().push(format!("{name}: drained"));
        Ok(())
    });
    s
}

#[tokio::test(start_paused = true)]
async fn each_stage_drains_before_the_next_is_cancelled() {
    let log = Log::default();
    let mut stages = Stages::new([
        stage("controllers", Duration::from_secs(3), &log),
        stage("webhook", Duration::from_secs(1), &log),
        stage("elector", Duration::ZERO, &log),
    ]);
    assert!(stages.until_stopped(async {}).await.is_none());
    stages.drain(Duration::from_secs(30)).await;
    assert_eq!(
        *log.lock().unwrap(),
        [
            "controllers: cancelled",
            "controllers: drained",
            "webhook: cancelled",
            "webhook: drained",
            "elector: cancelled",
            "elector: drained"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_stage_stuck_past_the_grace_is_left_and_the_next_still_drains() {
    let log = Log::default();
    let stages = Stages::new([
        stage("controllers", Duration::from_secs(3600), &log),
        stage("elector", Duration::ZERO, &log),
    ]);
    let started = tokio::time::Instant::now();
    stages.drain(Duration::from_secs(10)).await;
    assert_eq!(started.elapsed(), Duration::from_secs(10));
    assert_eq!(
        *log.lock().unwrap(),
        [
            "controllers: cancelled",
            "elector: cancelled",
            "elector: drained"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_that_ends_on_its_own_is_the_failure_and_the_others_still_drain_in_order() {
    let log = Log::default();
    let mut elector = Stage::new("elector");
    elector.tasks().spawn("leader-election", async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        anyhow::bail!("leadership lost: lease gk renewed by another")
    });
    let mut stages = Stages::new([
        stage("controllers", Duration::from_secs(1), &log),
        stage("webhook", Duration::from_secs(1), &log),
        elector,
    ]);
    let failed = stages
        .until_stopped(std::future::pending())
        .await
        .expect("the lost lease is the failure");
    let msg = format!("{failed:#}");
    assert!(
        msg.contains("leader-election failed") && msg.contains("leadership lost"),
        "{msg}"
    );
    stages.drain(Duration::from_secs(30)).await;
    assert_eq!(
        *log.lock().unwrap(),
        [
            "controllers: cancelled",
            "controllers: drained",
            "webhook: cancelled",
            "webhook: drained"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_stop_wins_over_a_task_ending_at_the_same_time() {
    let mut s = Stage::new("tasks");
    s.tasks().spawn("quick", async { Ok(()) });
    let mut stages = Stages::new([s]);
    tokio::task::yield_now().await;
    assert!(stages.until_stopped(async {}).await.is_none());
    let mut empty = Stages::new([Stage::new("none")]);
    assert!(empty.until_stopped(async {}).await.is_none());
}
