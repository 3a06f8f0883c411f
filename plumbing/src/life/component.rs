//! A component's life, the same for every one: its watches run from the start; it waits until
//! they have listed once, then until it may act (leadership, where it needs it); then its
//! crew of workers runs until the token is cancelled; then it drains in order: the crew is told
//! to stop, its work in flight finishes, then the feeders and the watches are stopped.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::watch as signal;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::watch::cache::Health;

/// One worker's step: takes the next piece of work and does it; false once there is no more
/// (the queue was shut down), which ends that worker.
pub trait Work: Send + Sync + 'static {
    fn process_next(&self) -> impl Future<Output = bool> + Send;
}

/// The workers a component runs while it may act, and what tells them to stop taking work.
#[derive(Default)]
pub struct Crew {
    tasks: JoinSet<()>,
    stops: Vec<Box<dyn FnOnce() + Send>>,
}

impl Crew {
    /// `n` workers, each calling `worker.process_next()` until it says there is no more.
    pub fn workers<W: Work>(mut self, n: usize, worker: Arc<W>) -> Self {
        for _ in 0..n {
            let w = worker.clone();
            self.tasks
                .spawn(async move { while w.process_next().await {} });
        }
        self
    }

    /// One loop that ends by itself once the component's token is cancelled (a periodic cycle).
    pub fn task(mut self, task: impl Future<Output = ()> + Send + 'static) -> Self {
        self.tasks.spawn(task);
        self
    }

    /// What tells the workers to stop taking new work (a queue shut down). Called once the
    /// token is cancelled, before their work in flight is waited for.
    pub fn on_stop(mut self, stop: impl FnOnce() + Send + 'static) -> Self {
        self.stops.push(Box::new(stop));
        self
    }

    /// Tells the workers to stop and waits for their work in flight; `abort`: does not wait
    /// (after a failure, when nothing else will end a loop that waits for the token).
    async fn drain(mut self, abort: bool) {
        for stop in self.stops.drain(..) {
            stop();
        }
        if abort {
            self.tasks.abort_all();
        }
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Resolves once the component's watches have listed once (see [`Life::feed`]).
pub struct Listed(signal::Receiver<bool>);

impl Listed {
    pub async fn wait(mut self) {
        if self.0.wait_for(|l| *l).await.is_err() {
            // The feeder ended without a list: nothing will start; the token ends the life.
            std::future::pending::<()>().await
        }
    }
}

/// One component's life: built with [`Life::new`], its watches and feeders added, then
/// [`Life::run`] until its token is cancelled.
pub struct Life {
    name: &'static str,
    token: CancellationToken,
    gate: Option<BoxFuture<'static, ()>>,
    feeders: Vec<tokio::task::JoinHandle<()>>,
    watches: JoinSet<()>,
}

impl Life {
    /// The life of the component `name` (its name in logs), which ends when `token` is
    /// cancelled.
    pub fn new(name: &'static str, token: CancellationToken) -> Self {
        Self {
            name,
            token,
            gate: None,
            feeders: Vec::new(),
            watches: JoinSet::new(),
        }
    }

    /// The crew starts only once `gate` has resolved too, after the first list (leadership: the
    /// caches fill on every replica, so a standby is warm, but only the leader acts).
    pub fn gated(mut self, gate: impl Future<Output = ()> + Send + 'static) -> Self {
        self.gate = Some(gate.boxed());
        self
    }

    /// The component's watches: they run from now until the crew drained, and are stopped
    /// then; ending earlier fails the component. They only read, so stopping them anywhere is
    /// safe.
    pub fn watches(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.watches.spawn(task);
    }

    /// Spawns the feeder, which hands each of `changes` to `on_change` (queues its keys), and
    /// returns what resolves once `health` says every watch has listed. That is checked after
    /// each change was handed over, so what the first list brought is queued before the crew
    /// starts. The feeder is stopped after the crew drained.
    pub fn feed<C, S, F>(&mut self, changes: S, health: Health, mut on_change: F) -> Listed
    where
        S: Stream<Item = C> + Send + 'static,
        F: FnMut(C) + Send + 'static,
    {
        let (tx, rx) = signal::channel(false);
        self.feeders.push(tokio::spawn(async move {
            let mut changes = std::pin::pin!(changes);
            while let Some(change) = changes.next().await {
                on_change(change);
                if health.listed() {
                    tx.send_if_modified(|l| !std::mem::replace(l, true));
                }
            }
        }));
        Listed(rx)
    }

    /// Lives the life: waits for `listed` and the gate, then runs the crew that `start` makes
    /// until the token is cancelled, then drains in order. Returns an error when a worker or
    /// the watches ended before the token was cancelled (a panic, or a bug): a component must
    /// not run on without them, and the binary stops on it.
    pub async fn run(
        mut self,
        listed: impl Future<Output = ()>,
        start: impl FnOnce() -> Crew,
    ) -> anyhow::Result<()> {
        let (name, token) = (self.name, self.token.clone());
        let gate = self.gate.take();
        let ready = async {
            listed.await;
            if let Some(gate) = gate {
                tracing::info!(controller = name, "caches synced; waiting for leadership");
                gate.await;
            }
        };
        let mut failure = tokio::select! {
            biased;
            _ = token.cancelled() => Some(Ok(())),
            Some(ended) = self.watches.join_next() => Some(Err(watches_ended(name, ended))),
            _ = ready => None,
        };
        if failure.is_none() {
            let mut crew = start();
            failure = tokio::select! {
                biased;
                _ = token.cancelled() => None,
                Some(ended) = self.watches.join_next() => Some(Err(watches_ended(name, ended))),
                Some(ended) = crew.tasks.join_next() => Some(Err(match ended {
                    Ok(()) => anyhow::anyhow!("{name}: a worker stopped on its own"),
                    Err(e) => anyhow::anyhow!("{name}: a worker failed: {e}"),
                })),
            };
            crew.drain(failure.is_some()).await;
        }
        for feeder in self.feeders {
            feeder.abort();
        }
        self.watches.abort_all();
        while self.watches.join_next().await.is_some() {}
        failure.unwrap_or(Ok(()))
    }
}

fn watches_ended(name: &str, ended: Result<(), JoinError>) -> anyhow::Error {
    match ended {
        Ok(()) => anyhow::anyhow!("{name}: its watches ended"),
        Err(e) => anyhow::anyhow!("{name}: its watches failed: {e}"),
    }
}
