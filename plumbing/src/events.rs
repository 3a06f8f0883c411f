//! The one Event writer of both binaries (`events.k8s.io/v1`): who reports, a repeat folded
//! into a series, `--dry-run` decided here for every Event, and the caller's fence around each
//! write when the caller is fenced.
//!
//! Why a series: an Event that happens again within [`SERIES_TTL`] (same type, reason, action,
//! object, and for [`Repeat::SeriesPerNote`] the same note) is one Event whose
//! `series.count` grows, as client-go's events recorder and kube's `Recorder` do, instead of a
//! new object each time. Why [`Repeat::Once`]: a report that must not be repeated even by a
//! restarted process is created under a name derived from what it reports; the apiserver's
//! 409 then says it was already recorded.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;
use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};

/// How long a recorded Event is remembered for a repeat to join its series (kube's and
/// client-go's 6 minutes).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// This replica's pod name from the downward API (`POD_NAME`), when the chart sets it. Read
/// here only.
pub fn pod_name() -> Option<String> {
    std::env::var("POD_NAME").ok().filter(|s| !s.is_empty())
}

/// The domain of every reporting controller: a component's Events are reported by
/// `groundskeeper.dev/<component>`, the component named as its binary's `--controllers` or
/// `--tasks` names it (`groundskeeper.dev/podgc`, `groundskeeper.dev/conntrack`), so one field
/// selector finds them all and none reads as kube-controller-manager's.
pub const REPORTING_DOMAIN: &str = "groundskeeper.dev";

/// The reporting controller of `component`'s Events: `groundskeeper.dev/<component>`.
pub fn reporting_controller(component: &str) -> String {
    format!("{REPORTING_DOMAIN}/{component}")
}

/// Whether `name` follows the scheme and the apiserver accepts it as an Event's
/// `reportingController` (a qualified name: a DNS subdomain prefix, `/`, then at most 63
/// characters of letters, digits, `-`, `_` and `.`, alphanumeric at both ends).
pub fn is_reporting_controller(name: &str) -> bool {
    let Some(component) = name
        .strip_prefix(REPORTING_DOMAIN)
        .and_then(|r| r.strip_prefix('/'))
    else {
        return false;
    };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !component.is_empty()
        && component.len() <= 63
        && edge(component.chars().next())
        && edge(component.chars().last())
        && component
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Who reports the Events: the controller's name and this replica.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reporter {
    pub controller: String,
    pub instance: String,
}

impl Reporter {
    /// `controller` from this pod ([`pod_name`]), or the controller's name when not in a pod.
    pub fn in_pod(controller: &str) -> Self {
        Self {
            controller: controller.into(),
            instance: pod_name().unwrap_or_else(|| controller.into()),
        }
    }

    /// `controller` from a named instance (a node agent: its node).
    pub fn on(controller: &str, instance: &str) -> Self {
        Self {
            controller: controller.into(),
            instance: instance.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Severity {
    Normal,
    Warning,
}

impl Severity {
    fn as_str(self) -> &'static str {
        match self {
            Severity::Normal => "Normal",
            Severity::Warning => "Warning",
        }
    }
}

/// What makes an Event the same as one recorded before.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Repeat {
    /// Same type, reason, action and object: one Event, counted in its series (client-go).
    Series,
    /// Also the same note: another note is an Event of its own, not hidden in the first's
    /// series (a second bad value).
    SeriesPerNote,
    /// Created once under this name; an existing Event of that name was recorded already, by
    /// this process or an earlier one.
    Once(String),
}

/// One Event to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub severity: Severity,
    pub reason: String,
    pub action: String,
    pub note: String,
    pub regarding: ObjectReference,
    pub repeat: Repeat,
}

/// What recording did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    Created,
    /// A repeat: the Event's series now counts this many.
    Repeated(i32),
    /// [`Repeat::Once`] found it already there.
    AlreadyThere,
    /// `--dry-run`: logged, nothing written.
    DryRun,
}

/// The gate a fenced caller's writes pass: the Lease fence of the controllers. A write it
/// refuses or drops comes back as an error.
pub trait Fence: Send + Sync + 'static {
    fn guard<'a>(
        &'a self,
        write: BoxFuture<'a, Result<(), kube::Error>>,
    ) -> BoxFuture<'a, Result<(), kube::Error>>;
}

/// Where Events are written: the API, or a test's recording.
pub trait Sink: Send + Sync + 'static {
    fn create<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), kube::Error>>;
    /// Merge-patches the Event's series.
    fn patch<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), kube::Error>>;
}

/// The API: each Event in its object's namespace (`default` for a cluster-scoped object, where
/// the apiserver wants them).
struct Api_(Client);

fn events_api(client: &Client, event: &Event) -> Api<Event> {
    let ns = event.metadata.namespace.as_deref().unwrap_or("default");
    Api::namespaced(client.clone(), ns)
}

impl Sink for Api_ {
    fn create<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async move {
            events_api(&self.0, event)
                .create(&PostParams::default(), event)
                .await
                .map(drop)
        })
    }

    fn patch<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async move {
            let name = event.metadata.name.as_deref().unwrap_or_default();
            let body = serde_json::json!({"series": event.series});
            events_api(&self.0, event)
                .patch(name, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .map(drop)
        })
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    severity: Severity,
    reason: String,
    action: String,
    regarding: String,
    note: Option<String>,
}

/// The Event writer; cheap to clone (clones share the series).
#[derive(Clone)]
pub struct Events {
    sink: Arc<dyn Sink>,
    reporter: Reporter,
    dry_run: bool,
    fence: Option<Arc<dyn Fence>>,
    series: Arc<Mutex<HashMap<Key, (Event, tokio::time::Instant)>>>,
}

impl Events {
    /// Events written to the API by `reporter`; only logged under `--dry-run`.
    pub fn new(client: Client, reporter: Reporter, dry_run: bool) -> Self {
        Self::to(Arc::new(Api_(client)), reporter, dry_run)
    }

    /// Events written to `sink` (a test's recording).
    pub fn to(sink: Arc<dyn Sink>, reporter: Reporter, dry_run: bool) -> Self {
        Self {
            sink,
            reporter,
            dry_run,
            fence: None,
            series: Arc::default(),
        }
    }

    /// Every write through `fence`: a replica that stops leading records nothing more.
    pub fn fenced(mut self, fence: Arc<dyn Fence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// `--dry-run`, as decided for the Events (for a caller's log wording).
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    fn event(&self, n: &Notice, now: k8s_openapi::jiff::Timestamp) -> Event {
        let name = match &n.repeat {
            Repeat::Once(name) => name.clone(),
            Repeat::Series | Repeat::SeriesPerNote => format!(
                "{}.{:x}",
                n.regarding
                    .name
                    .as_deref()
                    .unwrap_or(&self.reporter.controller),
                now.as_nanosecond()
            ),
        };
        Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(
                    n.regarding
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                ),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(n.severity.as_str().into()),
            reason: Some(n.reason.clone()),
            action: Some(n.action.clone()),
            note: Some(n.note.clone()),
            regarding: Some(n.regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(self.reporter.instance.clone()),
            ..Event::default()
        }
    }

    async fn write(
        &self,
        write: BoxFuture<'_, Result<(), kube::Error>>,
    ) -> Result<(), kube::Error> {
        match &self.fence {
            Some(f) => f.guard(write).await,
            None => write.await,
        }
    }

    /// Records `n`: created, or counted in the series of the same Event recorded within
    /// [`SERIES_TTL`]. The one place `--dry-run` is decided for Events.
    pub async fn publish(&self, n: &Notice) -> Result<Recorded, kube::Error> {
        self.record(n, true).await
    }

    /// [`Events::publish`] for a caller that has already logged, in its own words, what it
    /// reports (`dry-run: would report …` under dry-run): no second line for the same write.
    pub async fn publish_logged(&self, n: &Notice) -> Result<Recorded, kube::Error> {
        self.record(n, false).await
    }

    async fn record(&self, n: &Notice, log_dry_run: bool) -> Result<Recorded, kube::Error> {
        let what = format!(
            "{} {}",
            n.regarding.kind.as_deref().unwrap_or_default(),
            match (&n.regarding.namespace, &n.regarding.name) {
                (Some(ns), Some(name)) => format!("{ns}/{name}"),
                (None, Some(name)) => name.clone(),
                _ => String::new(),
            }
        );
        if self.dry_run {
            if log_dry_run {
                tracing::info!(reason = %n.reason, note = %n.note, "dry-run: would record event on {what}");
            }
            return Ok(Recorded::DryRun);
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        if let Repeat::Once(_) = n.repeat {
            let event = self.event(n, now);
            return match self.write(self.sink.create(&event)).await {
                Ok(()) => Ok(Recorded::Created),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Recorded::AlreadyThere),
                Err(e) => Err(e),
            };
        }
        let key = Key {
            severity: n.severity,
            reason: n.reason.clone(),
            action: n.action.clone(),
            regarding: format!("{:?}", n.regarding),
            note: (n.repeat == Repeat::SeriesPerNote).then(|| n.note.clone()),
        };
        let seen = tokio::time::Instant::now();
        let earlier = {
            let mut series = self.series.lock().unwrap_or_else(|p| p.into_inner());
            series.retain(|_, (_, at)| seen.duration_since(*at) < SERIES_TTL);
            series.get(&key).map(|(e, _)| e.clone())
        };
        let (event, outcome) = match earlier {
            Some(mut event) => {
                let count = event.series.as_ref().map_or(2, |s| s.count + 1);
                event.series = Some(EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                });
                self.write(self.sink.patch(&event)).await?;
                (event, Recorded::Repeated(count))
            }
            None => {
                let event = self.event(n, now);
                self.write(self.sink.create(&event)).await?;
                (event, Recorded::Created)
            }
        };
        self.series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (event, seen));
        Ok(outcome)
    }
}

/// A sink that keeps what it is given, for tests (the components' too).
#[derive(Default)]
pub struct Recording {
    /// Each Event as created or patched, in order.
    pub written: Mutex<Vec<Event>>,
    /// Answers to give, first to last, instead of success (an HTTP status code).
    pub failures: Mutex<std::collections::VecDeque<u16>>,
}

impl Recording {
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.written.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn keep(&self, event: &Event) -> Result<(), kube::Error> {
        if let Some(code) = self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
        {
            return Err(kube::Error::Api(
                kube::core::Status::failure("refused", "Test")
                    .with_code(code)
                    .boxed(),
            ));
        }
        self.written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event.clone());
        Ok(())
    }
}

impl Sink for Recording {
    fn create<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async move { self.keep(event) })
    }

    fn patch<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), kube::Error>> {
        Box::pin(async move { self.keep(event) })
    }
}
