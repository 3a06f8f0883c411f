//! One cleanup pass over a large real conntrack table, in a fresh network namespace.
//! Prints figures; asserts nothing about time.
//!
//!   cargo bench -p groundskeeper-node-agent --bench conntrack_pass [-- ENTRIES [stale=PCT]]
//!
//! Fills N entries (default 250k) with batched netlink creates and says how long that took:
//! 80% TCP established, 20% UDP DNATed to 100 UDP services with 3 endpoints each; PCT percent
//! of ALL entries (default 5; at most 20, the UDP share) are UDP flows to a
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

mod figures;
mod models;
mod table;

use std::collections::{BTreeSet, HashSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{
    figures::{Full, Triggered, full_pass, is_stale, is_udp, ms, scale},
    models::{changes, model, model_without, scope_selections, seen, services_model},
    table::{FULL_REPEATS, REPEATS, RaisedMax, chunks, entry, put_back},
};
use groundskeeper_node_agent::conntrack::apply::Kernel;
use groundskeeper_node_agent::conntrack::model::focus::Focus;
use groundskeeper_node_agent::conntrack::netlink::family::Family::V4;
use groundskeeper_node_agent::conntrack::netlink::filter::Select;
use groundskeeper_node_agent::conntrack::netlink::msg::{
    Entry, IPPROTO_UDP, STATUS_ASSURED, STATUS_SEEN_REPLY,
};
use groundskeeper_node_agent::conntrack::netlink::socket::Conntrack;
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use groundskeeper_node_agent::conntrack::pass::{self, PassReport, run_focused_pass};
use testkit::figures::mib;

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
                let removed = seen(&m0[V4], &m1[V4]).graces.removed;
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
                            if pass::staleness_in(
                                e,
                                &m1[V4],
                                &HashSet::new(),
                                &removed,
                                Some(scope),
                            )
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
                        Instant::now(),
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
