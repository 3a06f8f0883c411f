//! The Node Event for a filling conntrack table: once per crossing of the threshold, re-armed
//! only after the table drains below the threshold minus a hysteresis, so a table hovering
//! around the threshold does not produce an Event per pass.

use groundskeeper_plumbing::events::{Events, Notice, Recorded, Repeat, Reporter, Severity};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;

/// Fill ratio (nf_conntrack_count / nf_conntrack_max) at which the Event fires; the same bound
/// as the warning each pass logs and the chart's GroundskeeperConntrackTableFilling alert.
pub const THRESHOLD: f64 = 0.8;
/// How far below the threshold the ratio must fall before another crossing is reported.
pub const HYSTERESIS: f64 = 0.05;
pub const REASON: &str = "ConntrackTableFilling";

/// One table reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fill {
    pub count: f64,
    pub max: f64,
}

impl Fill {
    pub fn ratio(self) -> f64 {
        self.count / self.max
    }
}

/// Whether the next crossing is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alarm {
    armed: bool,
}

impl Default for Alarm {
    fn default() -> Self {
        Self { armed: true }
    }
}

impl Alarm {
    /// True when this reading crosses the threshold while armed (report it); disarms until the
    /// ratio falls below `threshold - hysteresis`.
    pub fn observe(&mut self, ratio: f64, threshold: f64, hysteresis: f64) -> bool {
        if self.armed && ratio > threshold {
            self.armed = false;
            return true;
        }
        if !self.armed && ratio < threshold - hysteresis {
            self.armed = true;
        }
        false
    }
}

/// Publishes the Event on this agent's Node (a crossing within minutes of the last joins its
/// series); the Event writer logs it instead under dry-run, which writes nothing.
pub struct Notifier {
    events: Events,
    node: ObjectReference,
    alarm: Alarm,
}

impl Notifier {
    pub fn new(client: Client, node_name: &str, dry_run: bool) -> Self {
        Self {
            events: Events::new(
                client,
                Reporter::on(crate::context::CONNTRACK_REPORTER, node_name),
                dry_run,
            ),
            // Node Events go in `default`, as kubelet's do; the uid is not needed to find them.
            node: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node_name.into()),
                ..ObjectReference::default()
            },
            alarm: Alarm::default(),
        }
    }

    /// Records the Event when this reading crosses the threshold; what happened is returned
    /// for tests, and logged.
    pub async fn observe(&mut self, fill: Fill) -> Outcome {
        if !self.alarm.observe(fill.ratio(), THRESHOLD, HYSTERESIS) {
            return Outcome::Quiet;
        }
        let note = format!(
            "conntrack table is {:.0}% full ({} of {} entries); new flows are dropped when it is full",
            fill.ratio() * 100.0,
            fill.count,
            fill.max
        );
        let event = Notice {
            severity: Severity::Warning,
            reason: REASON.into(),
            action: "Observe".into(),
            note,
            regarding: self.node.clone(),
            repeat: Repeat::Series,
        };
        match self.events.publish(&event).await {
            Ok(Recorded::DryRun) => Outcome::DryRun,
            Ok(_) => Outcome::Recorded,
            Err(e) => {
                tracing::warn!(error = %e, "could not record the conntrack fill Event on the Node");
                Outcome::Failed(e.to_string())
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No crossing: nothing to record.
    Quiet,
    DryRun,
    Recorded,
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_once_per_crossing_and_rearms_below_the_hysteresis() {
        // (ratio, fires)
        let steps = [
            (0.10, false),
            (0.80, false), // at the threshold is not above it
            (0.81, true),  // crossing
            (0.95, false), // still above: once per crossing
            (0.79, false), // below the threshold but within the hysteresis: not re-armed
            (0.82, false),
            (0.75, false), // exactly threshold - hysteresis: not below it
            (0.81, false),
            (0.74, false), // below: re-armed
            (0.74, false),
            (0.90, true), // the next crossing fires
            (1.00, false),
            (0.00, false),
            (0.85, true),
        ];
        let mut a = Alarm::default();
        for (i, (ratio, fires)) in steps.into_iter().enumerate() {
            assert_eq!(
                a.observe(ratio, THRESHOLD, HYSTERESIS),
                fires,
                "step {i}: {ratio}"
            );
        }
    }

    #[test]
    fn a_table_already_full_at_start_fires_at_once() {
        let mut a = Alarm::default();
        assert!(a.observe(0.99, THRESHOLD, HYSTERESIS));
        assert!(!a.observe(0.99, THRESHOLD, HYSTERESIS));
    }
}
