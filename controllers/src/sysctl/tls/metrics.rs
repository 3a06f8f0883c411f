//! The certificate task's Prometheus metrics: the served certificate's expiry and the
//! certificate steps taken.

use groundskeeper_plumbing::metrics::registered;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub certificate_expiry: IntGauge,
    pub certificate_steps: IntCounterVec,
}

impl Metrics {
    pub fn register(registry: &Registry) -> anyhow::Result<Self> {
        let certificate_expiry = registered(
            registry,
            IntGauge::new(
                "groundskeeper_sysctl_webhook_certificate_expiry_timestamp_seconds",
                "When the certificate this replica serves expires (Unix seconds); 0 until one is loaded.",
            ),
        )?;
        let certificate_steps = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "groundskeeper_sysctl_webhook_certificate_steps_total",
                    "Certificate writes made by this replica (self-signed mode): issue, stage, trusted \
                     (the caBundles seen holding the staged CA), untrusted (seen without it again), \
                     promote, ca_bundle (the webhook configuration's caBundles patched).",
                ),
                &["step"],
            ),
        )?;
        Ok(Self {
            certificate_expiry,
            certificate_steps,
        })
    }
}
