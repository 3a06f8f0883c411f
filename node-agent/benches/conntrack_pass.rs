//! One cleanup pass over a large real conntrack table, in a fresh network namespace.
//! Prints figures; asserts nothing about time.
//!
//!   cargo bench -p groundskeeper-node-agent --bench conntrack_pass [-- ENTRIES]
//!
//! Fills N entries (default 250k): 80% TCP established, 20% UDP DNATed to 100 UDP services
//! with 3 endpoints each, 10% of the UDP flows pointing at a removed endpoint. Reports the
//! pass's wall time, entries scanned and deleted, and peak RSS during the pass, next to
//! `conntrack -L` on the same table and a raw baseline (filtered dump + deletes), and the
//! triggered pass after a change to one service (an endpoint added; removed; removed from a
//! NodePort service) and to 16, each against the bare kernel-filtered dumps of the entries it
//! must judge (its scope: the service's frontend, nodePort and removed backends), against the
//! one dump of the service's frontend alone, and against the UDP dump. Up to
//! `MAX_FOCUSED_DUMPS` selections the kernel filters each dump, beyond that one UDP dump is
//! filtered here. Each triggered-pass figure is the best of 5 runs taken in turn with its
//! baselines (the stale flows put back before each).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use groundskeeper_node_agent::conntrack::apply::Kernel;
use groundskeeper_node_agent::conntrack::decide::{Focus, Scope};
use groundskeeper_node_agent::conntrack::model::{self, FamilyModel, Model};
use groundskeeper_node_agent::conntrack::netlink::family::Family::V4;
use groundskeeper_node_agent::conntrack::netlink::filter::Select;
use groundskeeper_node_agent::conntrack::netlink::msg::{
    Entry, IPPROTO_TCP, IPPROTO_UDP, STATUS_ASSURED, STATUS_SEEN_REPLY, Tuple,
};
use groundskeeper_node_agent::conntrack::netlink::socket::Conntrack;
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use groundskeeper_node_agent::conntrack::pass::{
    self, PassReport, PassState, run_focused_pass, run_pass,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

const SERVICES: u32 = 100;
/// Each triggered-pass figure is the best of this many runs (with its baselines, in turn).
const REPEATS: usize = 5;

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// Entry `i` of the table; `Some(true)` when it is a stale UDP flow.
fn entry(i: u32) -> (Entry, bool) {
    let client = IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 128, 0, 0)) + i / 50_000,
    ));
    let cport = 10_000 + (i % 50_000) as u16;
    let k = i / 5;
    let svc = (k % SERVICES) as u8;
    let (proto, front, back, stale) = if !i.is_multiple_of(5) {
        (
            IPPROTO_TCP,
            SocketAddr::new(ip(10, 96, 1, svc), 80),
            SocketAddr::new(ip(10, 244, 7, svc), 8080),
            false,
        )
    } else if k.is_multiple_of(10) {
        (
            IPPROTO_UDP,
            SocketAddr::new(ip(10, 96, 0, svc), 53),
            SocketAddr::new(ip(10, 244, 99, svc), 53),
            true,
        )
    } else {
        let ep = ((k / SERVICES) % 3) as u8;
        (
            IPPROTO_UDP,
            SocketAddr::new(ip(10, 96, 0, svc), 53),
            SocketAddr::new(ip(10, 244, ep, svc), 53),
            false,
        )
    };
    let e = Entry {
        orig: Tuple {
            src: client,
            dst: front.ip(),
            proto,
            src_port: cport,
            dst_port: front.port(),
        },
        reply: Tuple {
            src: back.ip(),
            dst: client,
            proto,
            src_port: back.port(),
            dst_port: cport,
        },
        id: None,
        zone: 0,
    };
    (e, stale)
}

fn model() -> FamilyModel {
    let mut m = FamilyModel::default();
    for s in 0..SERVICES as u8 {
        let serving = (0..3)
            .map(|ep| SocketAddr::new(ip(10, 244, ep, s), 53))
            .collect();
        m.frontends
            .insert(SocketAddr::new(ip(10, 96, 0, s), 53), serving);
    }
    m
}

/// The changes a triggered pass is measured after: (what, per changed service, its endpoints
/// after the change: `ep` octets of 10.244.ep.svc; before, every service has 0, 1, 2 and 99).
fn changes() -> Vec<(&'static str, Vec<Endpoints>)> {
    vec![
        (
            "1 service, an endpoint added:",
            vec![(0, vec![0, 1, 2, 99, 5])],
        ),
        ("1 service, an endpoint removed:", vec![(10, vec![0, 1, 2])]),
        (
            "1 NodePort service, an endpoint removed:",
            vec![(NODE_PORT_SERVICE, vec![0, 1, 2])],
        ),
        (
            "16 services, an endpoint removed each:",
            (20..36).map(|s| (s, vec![0, 1, 2])).collect(),
        ),
    ]
}

/// A service (by number) and its endpoints (octets of 10.244.ep.svc).
type Endpoints = (u8, Vec<u8>);

/// The service with a nodePort (30000 + its number).
const NODE_PORT_SERVICE: u8 = 40;

/// The model of the bench's 100 UDP services (ClusterIP 10.96.0.s:53, endpoints 10.244.{0,1,2,99}.s:53)
/// with `changed` services' endpoints replaced, built as the agent builds it.
fn services_model(changed: &[Endpoints]) -> Model {
    let mut objects: Vec<(Service, EndpointSlice)> = Vec::new();
    for s in 0..SERVICES as u8 {
        let eps = changed
            .iter()
            .find(|(c, _)| *c == s)
            .map_or(vec![0, 1, 2, 99], |(_, e)| e.clone());
        let node_port = (s == NODE_PORT_SERVICE).then_some(30000 + u16::from(s));
        let svc = serde_json::from_value(json!({
            "metadata": {"namespace": "bench", "name": format!("s{s}")},
            "spec": {"clusterIP": format!("10.96.0.{s}"),
                     "ports": [{"port": 53, "protocol": "UDP", "nodePort": node_port}]},
        }))
        .unwrap();
        let slice = serde_json::from_value(json!({
            "metadata": {"namespace": "bench", "name": format!("s{s}-1"),
                         "labels": {"kubernetes.io/service-name": format!("s{s}")}},
            "addressType": "IPv4",
            "ports": [{"port": 53, "protocol": "UDP"}],
            "endpoints": eps.iter().map(|e| json!({"addresses": [format!("10.244.{e}.{s}")]})).collect::<Vec<_>>(),
        }))
        .unwrap();
        objects.push((svc, slice));
    }
    model::build(
        objects.iter().map(|(s, _)| s),
        objects.iter().map(|(_, e)| e),
    )
}

/// Every kernel selection of the scope's entries, the frontend's first (what the triggered pass
/// would ask for with no limit on the number of dumps).
fn scope_selections(scope: &Scope) -> Vec<Select> {
    let mut out: Vec<Select> = scope
        .frontends
        .iter()
        .filter_map(|f| match f.ip() {
            IpAddr::V4(ip) => Some(Select::OrigDst(ip, f.port())),
            IpAddr::V6(_) => None,
        })
        .collect();
    out.sort();
    out.extend(scope.node_ports.iter().map(|p| Select::OrigDstPort(*p)));
    out.extend(scope.backends.iter().filter_map(|b| match b {
        IpAddr::V4(ip) => Some(Select::ReplySource(*ip)),
        IpAddr::V6(_) => None,
    }));
    out
}

/// One triggered pass and its baselines.
struct Triggered {
    what: &'static str,
    took: Duration,
    report: PassReport,
    walks: usize,
    filtered_here: bool,
    bare_all: Duration,
    bare_dumps: usize,
    bare_frontend: Duration,
    matched: usize,
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let n: u32 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(250_000);
    if let Some(why) = netns::unavailable() {
        println!("SKIPPED conntrack_pass: needs root and ip netns ({why})");
        return;
    }
    let ns = NetNs::create("bench").expect("netns");
    let max: u64 = ns
        .exec("cat", &["/proc/sys/net/netfilter/nf_conntrack_max"])
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if max < u64::from(n) {
        println!("SKIPPED conntrack_pass: nf_conntrack_max is {max}, below {n} entries");
        return;
    }
    let stale_total = (0..n).filter(|i| entry(*i).1).count();

    let fill = Instant::now();
    ns.run(|| {
        let mut ct = Conntrack::open().expect("netlink socket");
        let mut chunk = Vec::with_capacity(4096);
        let mut i = 0;
        while i < n {
            chunk.clear();
            chunk.extend((i..(i + 4096).min(n)).map(|j| entry(j).0));
            let r = ct
                .create(&chunk, 3600, STATUS_SEEN_REPLY | STATUS_ASSURED)
                .expect("create");
            assert!(
                r.failed.is_empty(),
                "create failed: {:?}",
                &r.failed[..r.failed.len().min(3)]
            );
            i += chunk.len() as u32;
        }
    })
    .unwrap();
    let fill = fill.elapsed();

    let cli = netns::has_conntrack_cli().then(|| {
        let t = Instant::now();
        let ok = Command::new("ip")
            .args(["netns", "exec", &ns.name, "conntrack", "-L"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        (t.elapsed(), ok)
    });

    let m = model();
    let (raw_dump, raw_udp, pass, report, hwm, rss_before, raw_delete, focused) = ns
        .run(|| {
            let mut ct = Conntrack::open().expect("netlink socket");
            let t = Instant::now();
            let mut udp = 0usize;
            ct.dump(V4, Some(IPPROTO_UDP), &mut |_| udp += 1)
                .expect("raw dump");
            let raw_dump = t.elapsed();

            let rss_before = status_kib("VmRSS:");
            // Reset the peak-RSS watermark so VmHWM covers the pass only.
            let _ = std::fs::write("/proc/self/clear_refs", "5");
            let t = Instant::now();
            // The agent's table: its own socket, opened by the pass's first dump.
            let mut cleaned = Kernel::default();
            let report = run_pass(&mut cleaned, V4, &m, &mut PassState::default()).expect("pass");
            let pass = t.elapsed();
            let hwm = status_kib("VmHWM:");

            // Baseline for the deletes: put the stale flows back and delete them by tuple.
            let stale: Vec<Entry> = (0..n)
                .map(entry)
                .filter(|(_, s)| *s)
                .map(|(e, _)| e)
                .collect();
            ct.create(&stale, 3600, STATUS_SEEN_REPLY | STATUS_ASSURED)
                .expect("recreate");
            let t = Instant::now();
            let r = ct.delete(&stale).expect("raw delete");
            assert_eq!(r.ok, stale.len());
            let raw_delete = t.elapsed();

            // Triggered passes, each after a change built into two models the way the agent
            // builds them; the stale flows are put back before each.
            // The machine may be shared: each figure is the best of REPEATS, taken in turn.
            let mut focused = vec![];
            for (what, change) in changes() {
                let (m0, m1) = (services_model(&[]), services_model(&change));
                let focus = Focus::between(&m0, &m1).expect("a focused change");
                let scope = &focus[V4];
                let selections = pass::selections(V4, scope);
                // The bare kernel-filtered dumps of the entries the scope touches (what the
                // triggered pass costs at the least), and the one dump of the service's
                // frontend alone.
                let bare = |ct: &mut Conntrack, sel: &[Select]| {
                    let t = Instant::now();
                    let mut matched = 0usize;
                    for s in sel {
                        ct.dump_select(V4, IPPROTO_UDP, *s, &mut |_| matched += 1)
                            .expect("filtered dump");
                    }
                    (t.elapsed(), matched)
                };
                let all = scope_selections(scope);
                let mut best: Option<Triggered> = None;
                for _ in 0..REPEATS {
                    // The stale flows are back (those still there answer EEXIST).
                    ct.create(&stale, 3600, STATUS_SEEN_REPLY | STATUS_ASSURED)
                        .expect("recreate");
                    let (bare_all, matched) = bare(&mut ct, &all);
                    let (bare_frontend, _) = bare(&mut ct, &all[..1]);
                    let t = Instant::now();
                    let r = run_focused_pass(
                        &mut cleaned,
                        V4,
                        &m1[V4],
                        &mut PassState::default(),
                        Some(scope),
                    )
                    .expect("focused pass");
                    let took = t.elapsed();
                    let b = best.get_or_insert(Triggered {
                        what,
                        took,
                        report: r,
                        walks: selections.as_ref().map_or(1, Vec::len),
                        filtered_here: selections.is_none(),
                        bare_all,
                        bare_dumps: all.len(),
                        bare_frontend,
                        matched,
                    });
                    b.took = b.took.min(took);
                    b.bare_all = b.bare_all.min(bare_all);
                    b.bare_frontend = b.bare_frontend.min(bare_frontend);
                }
                focused.push(best.expect("REPEATS > 0"));
            }
            (
                raw_dump, udp, pass, report, hwm, rss_before, raw_delete, focused,
            )
        })
        .unwrap();

    let baseline = raw_dump + raw_delete;
    println!(
        "conntrack_pass: {n} entries ({} UDP, {stale_total} stale), filled in {}",
        raw_udp,
        ms(fill)
    );
    match cli {
        Some((t, true)) => println!("  conntrack -L (whole table):         {}", ms(t)),
        Some((_, false)) => println!("  conntrack -L failed"),
        None => println!("  conntrack -L: CLI not installed"),
    }
    println!("  raw filtered dump (UDP only):       {}", ms(raw_dump));
    println!(
        "  raw delete of {stale_total} by tuple:        {}",
        ms(raw_delete)
    );
    println!(
        "  cleanup pass:                       {}  scanned={} stale={} deleted={} already_gone={} failed={}",
        ms(pass),
        report.scanned,
        report.stale,
        report.deleted,
        report.already_gone,
        report.failed_deletes
    );
    for f in &focused {
        let r: &PassReport = &f.report;
        let ratio = |b: Duration| f.took.as_secs_f64() / b.as_secs_f64().max(1e-9);
        println!(
            "  triggered pass, {:<40} {}  ({} kernel walk(s){}) scanned={} deleted={}",
            f.what,
            ms(f.took),
            f.walks,
            if f.filtered_here {
                ", one UDP dump filtered here"
            } else {
                ""
            },
            r.scanned,
            r.deleted,
        );
        println!(
            "      bare kernel-filtered dump(s) of the {} entries it must judge ({} dump(s)): {} -> {:.2}x (target <= 1.3x)",
            f.matched,
            f.bare_dumps,
            ms(f.bare_all),
            ratio(f.bare_all),
        );
        println!(
            "      bare kernel-filtered dump of the service's frontend alone: {} -> {:.2}x; bare UDP dump: {} -> {:.2}x",
            ms(f.bare_frontend),
            ratio(f.bare_frontend),
            ms(raw_dump),
            ratio(raw_dump),
        );
    }
    println!(
        "  pass / (raw dump + raw delete):     {:.2}x (target <= 1.3x)",
        pass.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "  peak RSS during the pass:           {:.1} MiB (RSS before: {:.1} MiB; target < 32 MiB)",
        hwm as f64 / 1024.0,
        rss_before as f64 / 1024.0
    );
}
