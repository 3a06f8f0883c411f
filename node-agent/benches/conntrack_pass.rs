//! One cleanup pass over a large real conntrack table, in a fresh network namespace.
//! Prints figures; asserts nothing about time.
//!
//!   cargo bench -p groundskeeper-node-agent --bench conntrack_pass [-- ENTRIES [stale=PCT]]
//!
//! Fills N entries (default 250k) with batched netlink creates and says how long that took:
//! 80% TCP established, 20% UDP DNATed to 100 UDP services with 3 endpoints each; PCT percent
//! of ALL entries (default 5, the mix; at most 20, the UDP share) are UDP flows to a
//! removed endpoint. The kernel's nf_conntrack_max is global (read-only inside a namespace):
//! when it is below N the bench raises it for the run and puts it back after (hashsize is left
//! alone: it is global too, and the baselines share its bucket length).
//! Reports the pass's wall time, entries scanned and deleted, and peak RSS during the pass, next
//! to `conntrack -L` on the same table and a raw baseline (the UDP dump + the deletes of the
//! same stale entries), each the best of `FULL_REPEATS` taken in turn. Then the triggered pass
//! after a change to one service (an endpoint added; removed; removed from a NodePort service)
//! and to 16, each against the bare kernel-filtered dumps of the entries it must judge (its
//! scope: the service's frontend, nodePort and removed backends) and those dumps plus the
//! deletes of the stale entries among them, against the one dump of the service's frontend
//! alone, and against the UDP dump. Up to `MAX_FOCUSED_DUMPS` selections the kernel filters
//! each dump, beyond that one UDP dump is filtered here. Each triggered-pass figure is the best
//! of 5 runs taken in turn with its baselines (the stale flows put back before each). Last, the
//! pass's peak RSS with a larger stale share (endpoints removed from the model, no refill): it
//! must stay flat in the number of stale entries.
//!
//! Every figure is also one line `bench <name>_<scale> <value> <unit>` (scale: `1m`, `100k`).

use std::collections::{BTreeSet, HashSet};
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
use testkit::figures::{mib, status_kib};

const SERVICES: u32 = 100;
/// Each triggered-pass figure is the best of this many runs (with its baselines, in turn).
const REPEATS: usize = 5;
/// Each full-pass figure (and its baselines) is the best of this many, in turn.
const FULL_REPEATS: usize = 3;
/// Entries generated, created or deleted at a time.
const CHUNK: u32 = 8192;

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// Entry `i` of the table and whether it is a stale UDP flow: one in five is UDP, and of the
/// UDP flows `stale_pct` in 20 point at the removed endpoint 10.244.99.s (so `stale_pct`% of
/// all entries), spread over every service.
fn entry(i: u32, stale_pct: u32) -> (Entry, bool) {
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
    } else if (k / SERVICES) % 20 < stale_pct {
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

/// The table's entries `which` picks, generated `CHUNK` at a time and handed to `each`: the
/// bench never holds the table or its stale list (it would count in the pass's peak RSS).
fn chunks(
    n: u32,
    stale_pct: u32,
    which: impl Fn(&Entry, bool) -> bool,
    mut each: impl FnMut(&[Entry]),
) {
    let mut chunk = Vec::with_capacity(CHUNK as usize);
    for i in 0..n {
        let (e, stale) = entry(i, stale_pct);
        if which(&e, stale) {
            chunk.push(e);
        }
        if chunk.len() == CHUNK as usize {
            each(&chunk);
            chunk.clear();
        }
    }
    if !chunk.is_empty() {
        each(&chunk);
    }
}

/// Creates the entries `which` picks; those still there answer EEXIST.
fn put_back(ct: &mut Conntrack, n: u32, stale_pct: u32, which: impl Fn(&Entry, bool) -> bool) {
    chunks(n, stale_pct, which, |c| {
        ct.create(c, 3600, STATUS_SEEN_REPLY | STATUS_ASSURED)
            .expect("recreate");
    });
}

/// Every service's serving endpoints 10.244.{0,1,2}.s:53 but the `removed` ones.
fn model_without(removed: &[u8]) -> FamilyModel {
    let mut m = FamilyModel::default();
    for s in 0..SERVICES as u8 {
        let serving = (0..3)
            .filter(|ep| !removed.contains(ep))
            .map(|ep| SocketAddr::new(ip(10, 244, ep, s), 53))
            .collect();
        m.frontends
            .insert(SocketAddr::new(ip(10, 96, 0, s), 53), serving);
    }
    m
}

fn model() -> FamilyModel {
    model_without(&[])
}

/// A pass's state after the agent saw `old` become `new` (the flows to backends that stopped
/// serving go at once; to any other not-serving backend they would wait the grace).
fn seen(old: &FamilyModel, new: &FamilyModel) -> PassState {
    let mut state = PassState::default();
    state.removed.observe(old, new, Instant::now());
    state
}

/// What every service served before the bench's stale flows went stale: 10.244.{0,1,2,99}.s.
fn model_before() -> FamilyModel {
    let mut m = model();
    for (f, serving) in &mut m.frontends {
        if let IpAddr::V4(v4) = f.ip() {
            serving.insert(SocketAddr::new(ip(10, 244, 99, v4.octets()[3]), 53));
        }
    }
    m
}

/// The changes a triggered pass is measured after: (what, per changed service, its endpoints
/// after the change: `ep` octets of 10.244.ep.svc; before, every service has 0, 1, 2 and 99).
/// The `bench` line of "1 service, an endpoint removed" is `triggered_pass_ratio_<scale>`;
/// the others carry their key.
fn changes() -> Vec<(&'static str, &'static str, Vec<Endpoints>)> {
    vec![
        (
            "1 service, an endpoint added:",
            "_added",
            vec![(0, vec![0, 1, 2, 99, 5])],
        ),
        (
            "1 service, an endpoint removed:",
            "",
            vec![(10, vec![0, 1, 2])],
        ),
        (
            "1 NodePort service, an endpoint removed:",
            "_node_port",
            vec![(NODE_PORT_SERVICE, vec![0, 1, 2])],
        ),
        (
            "16 services, an endpoint removed each:",
            "_16_services",
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
    key: &'static str,
    took: Duration,
    report: PassReport,
    walks: usize,
    filtered_here: bool,
    bare_all: Duration,
    bare_dumps: usize,
    /// The deletes of the stale entries the bare dumps returned.
    bare_delete: Duration,
    bare_stale: usize,
    bare_frontend: Duration,
    matched: usize,
}

/// One full pass over a stale share, with its memory.
struct Full {
    took: Duration,
    report: PassReport,
    /// VmHWM during the pass, and VmRSS just before it (KiB).
    hwm: u64,
    rss_before: u64,
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// `1m`, `250k`, or the number: the suffix of every `bench` line.
fn scale(n: u32) -> String {
    if n.is_multiple_of(1_000_000) {
        format!("{}m", n / 1_000_000)
    } else if n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

const CONNTRACK_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The global nf_conntrack_max raised for the run (it is read-only inside a namespace), put
/// back on drop.
struct RaisedMax(Option<u64>);

impl RaisedMax {
    fn at_least(want: u64) -> Result<Self, String> {
        let was = read_u64(CONNTRACK_MAX).ok_or_else(|| format!("cannot read {CONNTRACK_MAX}"))?;
        if was >= want {
            return Ok(Self(None));
        }
        std::fs::write(CONNTRACK_MAX, want.to_string())
            .map_err(|e| format!("{CONNTRACK_MAX} is {was} and cannot be raised to {want}: {e}"))?;
        println!("  nf_conntrack_max raised from {was} to {want} for the run (global)");
        Ok(Self(Some(was)))
    }
}

impl Drop for RaisedMax {
    fn drop(&mut self) {
        if let Some(was) = self.0 {
            let _ = std::fs::write(CONNTRACK_MAX, was.to_string());
        }
    }
}

/// Frees what the allocator keeps, then resets the peak-RSS watermark so VmHWM covers what
/// follows only.
fn reset_peak() -> u64 {
    // SAFETY: malloc_trim only returns free heap memory to the kernel.
    unsafe { libc::malloc_trim(0) };
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_kib(std::process::id(), "VmRSS:")
}

/// One full pass over the table as it is now, with its memory.
fn full_pass(table: &mut Kernel, m: &FamilyModel) -> Full {
    let rss_before = reset_peak();
    let t = Instant::now();
    let report = run_pass(table, V4, m, &mut seen(&model_before(), m)).expect("pass");
    let took = t.elapsed();
    Full {
        took,
        report,
        hwm: status_kib(std::process::id(), "VmHWM:"),
        rss_before,
    }
}

fn is_udp(e: &Entry, _: bool) -> bool {
    e.orig.proto == IPPROTO_UDP
}

fn is_stale(_: &Entry, stale: bool) -> bool {
    stale
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u32 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(250_000);
    let stale_pct: u32 = args
        .iter()
        .find_map(|a| a.strip_prefix("stale="))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("stale={v}: a whole percentage"))
        })
        .unwrap_or(5);
    assert!(
        stale_pct <= 20,
        "stale={stale_pct}: at most 20 (the UDP share of the table)"
    );
    let sc = scale(n);
    if let Some(why) = netns::unavailable() {
        println!("SKIPPED conntrack_pass: needs root and ip netns ({why})");
        return;
    }
    println!("conntrack_pass: {n} entries, {stale_pct}% stale");
    let _max = match RaisedMax::at_least(u64::from(n) + 4096) {
        Ok(m) => m,
        Err(why) => {
            println!("SKIPPED conntrack_pass: {why}");
            return;
        }
    };
    let ns = NetNs::create("bench").expect("netns");
    let buckets = ns
        .exec("cat", &["/proc/sys/net/netfilter/nf_conntrack_buckets"])
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let stale_total = (0..n).filter(|i| entry(*i, stale_pct).1).count();

    let fill = Instant::now();
    ns.run(|| {
        let mut ct = Conntrack::open().expect("netlink socket");
        chunks(
            n,
            stale_pct,
            |_, _| true,
            |c| {
                let r = ct
                    .create(c, 3600, STATUS_SEEN_REPLY | STATUS_ASSURED)
                    .expect("create");
                assert!(
                    r.failed.is_empty(),
                    "create failed: {:?}",
                    &r.failed[..r.failed.len().min(3)]
                );
            },
        );
    })
    .unwrap();
    let fill = fill.elapsed();
    println!(
        "  filled in {} ({:.0} entries/s; {buckets} hash buckets)",
        ms(fill),
        f64::from(n) / fill.as_secs_f64()
    );

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
    let (raw_dump, raw_udp, raw_delete, main_pass, focused, larger) = ns
        .run(|| {
            let mut ct = Conntrack::open().expect("netlink socket");
            // The agent's table: its own socket(s), opened by the pass's first dump.
            let mut cleaned = Kernel::default();
            let (mut raw_dump, mut raw_delete, mut udp) = (Duration::MAX, Duration::MAX, 0);
            let mut main_pass: Option<Full> = None;
            for _ in 0..FULL_REPEATS {
                // The baseline: the UDP dump, and the deletes of the same stale entries by
                // tuple (put back after).
                let t = Instant::now();
                udp = 0;
                ct.dump(V4, Some(IPPROTO_UDP), &mut |_| udp += 1)
                    .expect("raw dump");
                raw_dump = raw_dump.min(t.elapsed());
                let mut deleting = Duration::ZERO;
                let mut deleted = 0;
                chunks(n, stale_pct, is_stale, |c| {
                    let t = Instant::now();
                    deleted += ct.delete(c).expect("raw delete").ok;
                    deleting += t.elapsed();
                });
                assert_eq!(
                    deleted, stale_total,
                    "the raw baseline deletes every stale entry"
                );
                raw_delete = raw_delete.min(deleting);
                put_back(&mut ct, n, stale_pct, is_stale);

                let f = full_pass(&mut cleaned, &m);
                put_back(&mut ct, n, stale_pct, is_stale);
                // The best time; the highest peak (and the RSS before it).
                match &mut main_pass {
                    None => main_pass = Some(f),
                    Some(best) => {
                        best.took = best.took.min(f.took);
                        if f.hwm > best.hwm {
                            (best.hwm, best.rss_before) = (f.hwm, f.rss_before);
                        }
                    }
                }
            }

            // Triggered passes, each after a change built into two models the way the agent
            // builds them; the stale flows are put back before each.
            // The machine may be shared: each figure is the best of REPEATS, taken in turn.
            let mut focused = vec![];
            for (what, key, change) in changes() {
                let (m0, m1) = (services_model(&[]), services_model(&change));
                let focus = Focus::between(&m0, &m1).expect("a focused change");
                let scope = &focus[V4];
                let removed = seen(&m0[V4], &m1[V4]).removed;
                let selections = pass::selections(V4, scope);
                // The bare kernel-filtered dumps of the entries the scope touches (what the
                // triggered pass costs at the least), the deletes of the stale ones among
                // them, and the one dump of the service's frontend alone.
                let bare = |ct: &mut Conntrack, sel: &[Select], stale: &mut BTreeSet<Entry>| {
                    let t = Instant::now();
                    let mut matched = 0usize;
                    for s in sel {
                        ct.dump_select(V4, IPPROTO_UDP, *s, &mut |e| {
                            matched += 1;
                            if pass::judge(e, &m1[V4], &HashSet::new(), &removed, Some(scope))
                                .is_some()
                            {
                                stale.insert(*e);
                            }
                        })
                        .expect("filtered dump");
                    }
                    (t.elapsed(), matched)
                };
                let all = scope_selections(scope);
                let mut best: Option<Triggered> = None;
                for repeat in 0..REPEATS {
                    // The stale flows are back (those still there answer EEXIST).
                    put_back(&mut ct, n, stale_pct, is_stale);
                    let mut stale = BTreeSet::new();
                    // A scope the pass reads with one UDP dump needs many bare dumps (32 for
                    // 16 services, a walk of the whole table each): measured once.
                    let sel: &[Select] = if selections.is_none() && repeat > 0 {
                        &all[..1]
                    } else {
                        &all
                    };
                    let (bare_all, matched) = bare(&mut ct, sel, &mut stale);
                    let stale: Vec<Entry> = stale.into_iter().collect();
                    let t = Instant::now();
                    let r = ct.delete(&stale).expect("bare delete");
                    let bare_delete = t.elapsed();
                    assert_eq!(r.ok, stale.len());
                    put_back(&mut ct, n, stale_pct, is_stale);
                    let (bare_frontend, _) = bare(&mut ct, &all[..1], &mut BTreeSet::new());
                    let t = Instant::now();
                    let r = run_focused_pass(
                        &mut cleaned,
                        V4,
                        &m1[V4],
                        &mut seen(&m0[V4], &m1[V4]),
                        Some(scope),
                    )
                    .expect("focused pass");
                    let took = t.elapsed();
                    let b = best.get_or_insert(Triggered {
                        what,
                        key,
                        took,
                        report: r,
                        walks: selections.as_ref().map_or(1, Vec::len),
                        filtered_here: selections.is_none(),
                        bare_all,
                        bare_dumps: all.len(),
                        bare_delete,
                        bare_stale: stale.len(),
                        bare_frontend,
                        matched,
                    });
                    b.took = b.took.min(took);
                    if sel.len() == all.len() {
                        b.bare_all = b.bare_all.min(bare_all);
                        b.bare_delete = b.bare_delete.min(bare_delete);
                    }
                    b.bare_frontend = b.bare_frontend.min(bare_frontend);
                }
                focused.push(best.expect("REPEATS > 0"));
            }

            // Larger stale shares, by taking endpoints out of the model: the pass's memory must
            // not grow with them. Every UDP flow is put back before each.
            let mut larger = vec![];
            for removed in [&[0u8][..], &[0, 1, 2]] {
                put_back(&mut ct, n, stale_pct, is_udp);
                larger.push(full_pass(&mut cleaned, &model_without(removed)));
            }
            (
                raw_dump,
                udp,
                raw_delete,
                main_pass.expect("FULL_REPEATS > 0"),
                focused,
                larger,
            )
        })
        .unwrap();

    let baseline = raw_dump + raw_delete;
    println!("  {raw_udp} UDP entries, {stale_total} stale");
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
    let r = main_pass.report;
    println!(
        "  cleanup pass:                       {}  scanned={} stale={} deleted={} already_gone={} failed={}",
        ms(main_pass.took),
        r.scanned,
        r.stale,
        r.deleted,
        r.already_gone,
        r.failed_deletes
    );
    let mut lines = vec![(
        format!("conntrack_fill_{sc}"),
        format!("{:.2} s", fill.as_secs_f64()),
    )];
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
            "      bare kernel-filtered dump(s) of the {} entries it must judge ({} dump(s)): {} -> {:.2}x",
            f.matched,
            f.bare_dumps,
            ms(f.bare_all),
            ratio(f.bare_all),
        );
        println!(
            "      those dump(s) + delete of the {} stale among them: {} -> {:.2}x (target <= 1.3x)",
            f.bare_stale,
            ms(f.bare_all + f.bare_delete),
            ratio(f.bare_all + f.bare_delete),
        );
        println!(
            "      bare kernel-filtered dump of the service's frontend alone: {} -> {:.2}x; bare UDP dump: {} -> {:.2}x",
            ms(f.bare_frontend),
            ratio(f.bare_frontend),
            ms(raw_dump),
            ratio(raw_dump),
        );
        lines.push((
            format!("triggered_pass_ratio_{sc}{}", f.key),
            format!("{:.2} ratio", ratio(f.bare_all + f.bare_delete)),
        ));
    }
    let full_ratio = main_pass.took.as_secs_f64() / baseline.as_secs_f64();
    println!("  pass / (raw dump + raw delete):     {full_ratio:.2}x (target <= 1.3x)");
    lines.push((
        format!("full_pass_ratio_{sc}"),
        format!("{full_ratio:.2} ratio"),
    ));
    lines.push((
        format!("full_pass_{sc}"),
        format!("{:.3} s", main_pass.took.as_secs_f64()),
    ));
    lines.push((
        format!("raw_dump_delete_{sc}"),
        format!("{:.3} s", baseline.as_secs_f64()),
    ));
    let mut rss = |f: &Full, suffix: String| {
        let stale_share = f.report.stale as f64 * 100.0 / f64::from(n);
        println!(
            "  peak RSS during the pass, {:>5.1}% stale ({} entries): {:.1} MiB, {:+.1} MiB over the RSS before ({:.1} MiB)",
            stale_share,
            f.report.stale,
            mib(f.hwm),
            mib(f.hwm) - mib(f.rss_before),
            mib(f.rss_before),
        );
        lines.push((
            format!("full_pass_peak_rss_{sc}{suffix}"),
            format!("{:.1} MiB", mib(f.hwm)),
        ));
        lines.push((
            format!("full_pass_rss_growth_{sc}{suffix}"),
            format!("{:.1} MiB", mib(f.hwm) - mib(f.rss_before)),
        ));
        stale_share
    };
    rss(&main_pass, String::new());
    for f in &larger {
        let pct = (f.report.stale as f64 * 100.0 / f64::from(n)).round();
        rss(f, format!("_{pct}stale"));
    }
    for (name, value) in lines {
        println!("bench {name} {value}");
    }
}
