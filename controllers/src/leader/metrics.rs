//! Whether this replica leads, twice: `groundskeeper_leader_election_is_leader` and client-go's
//! `leader_election_master_status{name}` (component-base's leaderelection metrics), which the
//! dashboards and alerts built for kube-controller-manager and kube-scheduler read.

use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};

use groundskeeper_plumbing::metrics::registered;

/// Both gauges, always set together.
#[derive(Clone)]
pub struct LeaderMetrics {
    is_leader: IntGauge,
    /// `leader_election_master_status{name=<lease name>}`.
    master_status: IntGauge,
}

impl LeaderMetrics {
    /// Registers both, client-go's labelled with the Lease's name (`name` is the lease in
    /// client-go's leader election config).
    pub fn register(registry: &Registry, lease_name: &str) -> prometheus::Result<Self> {
        let is_leader = registered(
            registry,
            IntGauge::new(
                "groundskeeper_leader_election_is_leader",
                "1 when this replica holds the controller-manager Lease, else 0.",
            ),
        )?;
        let status = registered(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "leader_election_master_status",
                    "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
                ),
                &["name"],
            ),
        )?;
        let master_status = status.with_label_values(&[lease_name]);
        master_status.set(0);
        Ok(Self {
            is_leader,
            master_status,
        })
    }

    pub fn set(&self, leading: bool) {
        let v = i64::from(leading);
        self.is_leader.set(v);
        self.master_status.set(v);
    }

    /// 1 when leading, else 0; both gauges must say the same.
    pub fn value(&self) -> i64 {
        let (ours, client_go) = (self.is_leader.get(), self.master_status.get());
        assert_eq!(
            ours, client_go,
            "groundskeeper_leader_election_is_leader and leader_election_master_status disagree"
        );
        ours
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both series, as a scrape shows them: a standby 0, a leader 1, client-go's under the
    /// lease's name.
    #[test]
    fn both_gauges_follow_leadership() {
        let r = Registry::new();
        let m = LeaderMetrics::register(&r, "groundskeeper-controller-manager").unwrap();
        let text = |r: &Registry| groundskeeper_plumbing::metrics::render(r);
        let line = r#"leader_election_master_status{name="groundskeeper-controller-manager"}"#;
        assert!(text(&r).contains(&format!("{line} 0")), "{}", text(&r));
        assert!(text(&r).contains("groundskeeper_leader_election_is_leader 0"));
        m.set(true);
        assert_eq!(m.value(), 1);
        assert!(text(&r).contains(&format!("{line} 1")), "{}", text(&r));
        assert!(text(&r).contains("groundskeeper_leader_election_is_leader 1"));
        m.set(false);
        assert_eq!(m.value(), 0);
        assert!(text(&r).contains(&format!("{line} 0")));
    }
}
