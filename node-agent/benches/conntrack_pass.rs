//! One cleanup pass over a large real conntrack table, in a fresh network namespace.
//! Prints figures; asserts nothing about time.
//!
//!   cargo bench -p groundskeeper-node-agent --bench conntrack_pass [-- ENTRIES]
//!
//! Fills N entries (default 250k): 80% TCP established, 20% UDP DNATed to 100 UDP services
//! with 3 endpoints each, 10% of the UDP flows pointing at a removed endpoint. Reports the
//! pass's wall time, entries scanned and deleted, and peak RSS during the pass, next to
//! `conntrack -L` on the same table and a raw baseline (filtered dump + deletes), and the
//! triggered (focused) pass after 1, 2 and 16 endpoints were removed: up to
//! `MAX_FOCUSED_DUMPS` sources the kernel filters its IPv4 dumps on the reply source, beyond
//! that one UDP dump is filtered here.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use groundskeeper_node_agent::conntrack::apply::Kernel;
use groundskeeper_node_agent::conntrack::family::Family::V4;
use groundskeeper_node_agent::conntrack::model::FamilyModel;
use groundskeeper_node_agent::conntrack::msg::{
    Entry, IPPROTO_TCP, IPPROTO_UDP, STATUS_ASSURED, STATUS_SEEN_REPLY, Tuple,
};
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use groundskeeper_node_agent::conntrack::pass::{
    PassReport, PassState, run_focused_pass, run_pass,
};
use groundskeeper_node_agent::conntrack::socket::Conntrack;

const SERVICES: u32 = 100;

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

            // Triggered passes: the stale flows are back; the removed endpoints of 1, then of
            // 16 more services are the focus.
            ct.create(&stale, 3600, STATUS_SEEN_REPLY | STATUS_ASSURED)
                .expect("recreate");
            let mut focused = vec![];
            for range in [0..1u8, 10..12, 20..36] {
                let sources = range.clone().map(|s| ip(10, 244, 99, s)).collect();
                // The bare kernel-filtered dump of the same entries: what the triggered pass
                // costs at the least.
                let t = Instant::now();
                let mut matched = 0usize;
                for s in range.clone() {
                    ct.dump_reply_src(IPPROTO_UDP, Ipv4Addr::new(10, 244, 99, s), &mut |_| {
                        matched += 1
                    })
                    .expect("filtered dump");
                }
                let bare = t.elapsed();
                let t = Instant::now();
                let r = run_focused_pass(
                    &mut cleaned,
                    V4,
                    &m,
                    &mut PassState::default(),
                    Some(&sources),
                )
                .expect("focused pass");
                focused.push((range.len(), t.elapsed(), r, bare, matched));
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
    for (sources, t, r, bare, matched) in &focused {
        let r: &PassReport = r;
        println!(
            "  triggered pass, {sources:>2} removed endpoint(s): {}  scanned={} deleted={}; bare filtered dump of the same {matched} entries: {} ({:.2}x; target <= 1.3x for 1-2 sources)",
            ms(*t),
            r.scanned,
            r.deleted,
            ms(*bare),
            t.as_secs_f64() / bare.as_secs_f64().max(1e-9)
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
