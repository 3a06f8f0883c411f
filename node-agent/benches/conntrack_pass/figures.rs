//! What a pass is measured as (`Full`, `Triggered`), the full pass itself, and how figures are
//! printed.

use std::time::{Duration, Instant};

use crate::{
    models::{model_before, seen},
    table::reset_peak,
};
use groundskeeper_node_agent::conntrack::apply::Kernel;
use groundskeeper_node_agent::conntrack::model::FamilyModel;
use groundskeeper_node_agent::conntrack::netlink::family::Family::V4;
use groundskeeper_node_agent::conntrack::netlink::msg::{Entry, IPPROTO_UDP};
use groundskeeper_node_agent::conntrack::pass::{PassReport, run_pass};
use testkit::figures::status_kib;

/// One triggered pass and its baselines.
pub(crate) struct Triggered {
    pub(crate) what: &'static str,
    pub(crate) key: &'static str,
    pub(crate) took: Duration,
    pub(crate) report: PassReport,
    pub(crate) walks: usize,
    pub(crate) filtered_here: bool,
    pub(crate) bare_all: Duration,
    pub(crate) bare_dumps: usize,
    /// The deletes of the stale entries the bare dumps returned.
    pub(crate) bare_delete: Duration,
    pub(crate) bare_stale: usize,
    pub(crate) bare_frontend: Duration,
    pub(crate) matched: usize,
}

/// One full pass over a stale share, with its memory.
pub(crate) struct Full {
    pub(crate) took: Duration,
    pub(crate) report: PassReport,
    /// VmHWM during the pass, and VmRSS just before it (KiB).
    pub(crate) hwm: u64,
    pub(crate) rss_before: u64,
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// `1m`, `250k`, or the number: the suffix of every `bench` line.
pub(crate) fn scale(n: u32) -> String {
    if n.is_multiple_of(1_000_000) {
        format!("{}m", n / 1_000_000)
    } else if n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// One full pass over the table as it is now, with its memory.
pub(crate) fn full_pass(table: &mut Kernel, m: &FamilyModel) -> Full {
    let rss_before = reset_peak();
    let t = Instant::now();
    let report =
        run_pass(table, V4, m, &mut seen(&model_before(), m), Instant::now()).expect("pass");
    let took = t.elapsed();
    Full {
        took,
        report,
        hwm: status_kib(std::process::id(), "VmHWM:"),
        rss_before,
    }
}

pub(crate) fn is_udp(e: &Entry, _: bool) -> bool {
    e.orig.proto == IPPROTO_UDP
}

pub(crate) fn is_stale(_: &Entry, stale: bool) -> bool {
    stale
}
