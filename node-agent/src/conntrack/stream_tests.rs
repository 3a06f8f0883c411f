//! The pass deletes while its dump streams: checked over focus_tests' generated clusters and
//! tables (full and triggered passes, both families, orphaned service IPs, small batches,
//! dumps interrupted and retried). At no point of a dump does it hold more stale entries than
//! its batch, and it deletes exactly what the collect-then-delete pass it replaced deleted
//! (restated here as the reference). And on the kernel's table, deleting while the dump
//! streams over many replies skips nothing and touches nothing else.

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use testkit::rng::Rng;

use super::apply::{Delete, Dump, Kernel, Table};
use super::decide::Stale;
use super::focus_tests::{case, host};
use super::model::focus::{Focus, Scope};
use super::model::{FamilyModel, canonical};
use super::netlink::family::Family::{self, V4};
use super::netlink::msg::{Entry, IPPROTO_UDP, STATUS_ASSURED, STATUS_SEEN_REPLY};
use super::netlink::socket::{BatchReport, Conntrack, DumpError};
use super::netns::{self, NetNs};
use super::pass::{PassState, run_focused_pass, run_pass, selections, staleness_in};
use super::test_support::{dumps, remove_entries};

/// What the pass did to the table, in order.
#[derive(Debug)]
enum Event {
    /// The dump handed it this entry.
    Visit(Entry),
    /// It deleted this batch.
    Delete(Vec<Entry>),
}

/// A table that does what the kernel does with each dump and delete (filters honoured, deleted
/// entries gone from later dumps), records what the pass saw and deleted, and interrupts its
/// first `interrupt` dumps after `after` entries.
struct Watched {
    entries: Vec<Entry>,
    host: HashSet<IpAddr>,
    events: Vec<Event>,
    interrupt: usize,
    after: usize,
}

impl Table for Watched {
    fn dump(
        &mut self,
        what: Dump,
        visit: &mut dyn FnMut(&Entry, &mut dyn Delete),
    ) -> Result<usize, DumpError> {
        let read: Vec<Entry> = self
            .entries
            .iter()
            .filter(|e| dumps(what, e))
            .copied()
            .collect();
        let cut = self.interrupt > 0;
        let n = if cut {
            self.after.min(read.len())
        } else {
            read.len()
        };
        for e in &read[..n] {
            self.events.push(Event::Visit(*e));
            visit(e, self);
        }
        if cut {
            self.interrupt -= 1;
            return Err(DumpError::Interrupted);
        }
        Ok(n)
    }

    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        Ok(self.host.clone())
    }
}

impl Delete for Watched {
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        let report = remove_entries(&mut self.entries, stale);
        self.events
            .push(Event::Delete(stale.iter().map(|(e, _)| *e).collect()));
        Ok(report)
    }
}

/// What the collect-then-delete pass deleted from `table`: it read the scope's selections (or
/// the family's UDP entries), judged each entry, kept every stale one (each once) until the
/// dump was complete, let flows to orphaned service IPs wait for their grace (remembering, in
/// `state`, the IPs this view showed orphaned), then deleted them all.
fn collect_then_delete(
    table: &[Entry],
    fam: Family,
    model: &FamilyModel,
    scope: Option<&Scope>,
    state: &mut PassState,
) -> BTreeSet<Entry> {
    let now = Instant::now();
    let host: HashSet<IpAddr> = host().into_iter().map(canonical).collect();
    let sels = scope.and_then(|s| selections(fam, s));
    let mut marked: Vec<(Entry, Stale)> = table
        .iter()
        .filter(|e| e.orig.family() == fam && e.orig.proto == IPPROTO_UDP)
        .filter(|e| sels.as_ref().is_none_or(|s| s.iter().any(|s| s.matches(e))))
        .filter_map(|e| {
            staleness_in(e, model, &host, &state.graces.removed, scope).map(|why| (*e, why))
        })
        .collect();
    if scope.is_none() {
        let seen: HashSet<IpAddr> = marked
            .iter()
            .filter(|(_, why)| *why == Stale::OrphanedServiceIp)
            .map(|(e, _)| canonical(e.orig.dst))
            .collect();
        state.graces.orphans.retain(|ip, _| seen.contains(ip));
        for ip in &seen {
            state.graces.orphans.entry(*ip).or_insert(now);
        }
        let (orphans, grace) = (&state.graces.orphans, state.orphan_grace);
        marked.retain(|(e, why)| {
            *why != Stale::OrphanedServiceIp
                || orphans
                    .get(&canonical(e.orig.dst))
                    .is_some_and(|since| now.saturating_duration_since(*since) >= grace)
        });
    }
    marked.into_iter().map(|(e, _)| e).collect()
}

/// The orphaned service IPs of focus_tests' tables.
const ORPHANED: [&str; 2] = ["10.96.0.200", "fd00:10:96::c8"];

/// A state as a pass finds it: some orphaned IPs seen long ago (their flows due), some never.
fn state(rng: &mut Rng, cap: usize) -> PassState {
    let mut s = PassState {
        orphan_grace: Duration::from_secs(3600),
        delete_batch: cap,
        ..PassState::seen_all()
    };
    let long_ago = Instant::now() - Duration::from_secs(7200);
    for ip in ORPHANED {
        if rng.chance(50) {
            s.graces.orphans.insert(ip.parse().unwrap(), long_ago);
        }
    }
    s
}

/// The entries the pass deleted, each batch's size, and the most stale entries it held at any
/// point of its dumps: entries it had been handed and would delete, not deleted yet.
fn outcome(events: &[Event]) -> (Vec<Entry>, Vec<usize>, usize) {
    let deleted: Vec<Entry> = events
        .iter()
        .flat_map(|ev| match ev {
            Event::Delete(b) => b.clone(),
            Event::Visit(_) => vec![],
        })
        .collect();
    let will: HashSet<Entry> = deleted.iter().copied().collect();
    let (mut handed, mut gone, mut most) = (HashSet::new(), 0, 0);
    let mut sizes = vec![];
    for ev in events {
        match ev {
            Event::Visit(e) => {
                if will.contains(e) {
                    handed.insert(*e);
                }
            }
            Event::Delete(b) => {
                gone += b.len();
                sizes.push(b.len());
            }
        }
        most = most.max(handed.len().saturating_sub(gone));
    }
    (deleted, sizes, most)
}

#[derive(Debug, Default)]
struct Tally {
    passes: usize,
    deleted: usize,
    held_at_cap: usize,
    interrupted: usize,
    orphans_deleted: usize,
}

/// One pass of each kind over each generated case, checked against the reference. Dumps are
/// interrupted (and retried) when `interrupts`; the held bound is checked without them (an
/// interrupted attempt's dropped entries are handed again by the retry).
fn check_cases(interrupts: bool) -> Tally {
    let mut t = Tally::default();
    for seed in 0..250u64 {
        let c = case(seed, 150);
        let mut rng = Rng(seed ^ 0x5eed);
        let focus = Focus::between(&c.m0, &c.m1);
        for fam in Family::ALL {
            for scope in [None, focus.as_ref().map(|f| &f[fam])] {
                let cap = 1 + rng.below(6);
                let mut st = state(&mut rng, cap);
                let mut reference_state = st.clone();
                let want =
                    collect_then_delete(&c.table, fam, &c.m1[fam], scope, &mut reference_state);
                let mut table = Watched {
                    entries: c.table.clone(),
                    host: host(),
                    events: vec![],
                    // Fewer than MAX_DUMP_ATTEMPTS: the last attempt is complete.
                    interrupt: if interrupts { 1 + rng.below(3) } else { 0 },
                    after: rng.below(40),
                };
                let r =
                    run_focused_pass(&mut table, fam, &c.m1[fam], &mut st, scope, Instant::now())
                        .unwrap();
                let (deleted, sizes, most) = outcome(&table.events);
                let got: BTreeSet<Entry> = deleted.iter().copied().collect();
                let what = format!("seed {seed} {fam} scoped={}", scope.is_some());
                assert_eq!(got.len(), deleted.len(), "{what}: an entry deleted twice");
                if got != want {
                    let show = |a: &BTreeSet<Entry>, b: &BTreeSet<Entry>| {
                        a.difference(b).map(|e| e.to_string()).collect::<Vec<_>>()
                    };
                    panic!(
                        "{what}: deleted beyond the reference {:?}, missing {:?}",
                        show(&got, &want),
                        show(&want, &got)
                    );
                }
                assert_eq!((r.deleted, r.stale), (got.len(), got.len()), "{what}");
                let keys =
                    |s: &PassState| s.graces.orphans.keys().copied().collect::<BTreeSet<_>>();
                if interrupts {
                    // An IP whose last flows an interrupted attempt deleted is not in the
                    // retry's view: forgotten a pass early (its grace starts over).
                    assert!(keys(&st).is_subset(&keys(&reference_state)), "{what}");
                } else {
                    assert_eq!(
                        keys(&st),
                        keys(&reference_state),
                        "{what}: orphans remembered"
                    );
                }
                assert!(
                    sizes.iter().all(|s| *s <= cap),
                    "{what}: batches {sizes:?} over {cap}"
                );
                if !interrupts {
                    assert!(
                        most <= cap,
                        "{what}: held {most} stale entries, batch {cap}"
                    );
                }
                t.passes += 1;
                t.deleted += got.len();
                t.held_at_cap += usize::from(most == cap && got.len() > cap);
                t.interrupted += usize::from(r.dump_attempts > 1);
                t.orphans_deleted += got
                    .iter()
                    .filter(|e| ORPHANED.contains(&canonical(e.orig.dst).to_string().as_str()))
                    .count();
            }
        }
    }
    t
}

#[test]
fn a_pass_never_holds_more_stale_entries_than_its_batch() {
    let t = check_cases(false);
    println!("{t:?}");
    // The generator reaches what the property is about: batches fill up, orphans go.
    assert!(
        t.passes > 800 && t.deleted > 3000 && t.held_at_cap > 300 && t.orphans_deleted > 20,
        "{t:?}"
    );
}

#[test]
fn a_pass_deletes_what_collect_then_delete_deleted_also_across_interrupted_dumps() {
    let t = check_cases(true);
    println!("{t:?}");
    assert!(
        t.passes > 800 && t.deleted > 3000 && t.interrupted > 500,
        "{t:?}"
    );
}

/// On the kernel's table: thousands of entries (many dump replies), a third stale, deleted in
/// batches of 7 while the dump streams. Exactly the stale ones go; every other stays.
#[test]
fn deleting_while_the_kernel_dump_streams_skips_nothing_and_touches_nothing_else() {
    let name = "deleting_while_the_kernel_dump_streams_skips_nothing_and_touches_nothing_else";
    if let Some(why) = netns::unavailable() {
        testkit::skipped(name, &format!("needs root and ip netns ({why})"));
        return;
    }
    let sa = |s: &str| -> SocketAddr { s.parse().unwrap() };
    let mut model = FamilyModel::default();
    model.frontends.insert(
        sa("10.96.0.10:53"),
        [sa("10.244.1.5:53"), sa("10.244.1.6:53")].into(),
    );
    let (mut keep, mut gone) = (BTreeSet::new(), BTreeSet::new());
    let mut all = vec![];
    for i in 0..6000u32 {
        let client = SocketAddr::new(
            IpAddr::from([10, 1, (i / 250) as u8, (i % 250) as u8]),
            10_000 + (i % 7) as u16,
        );
        let backend = match i % 3 {
            0 => sa("10.244.9.9:53"),
            1 => sa("10.244.1.5:53"),
            _ => sa("10.244.1.6:53"),
        };
        let e = Entry::dnat(IPPROTO_UDP, client, sa("10.96.0.10:53"), backend);
        all.push(e);
        if i % 3 == 0 { &mut gone } else { &mut keep }.insert(e);
    }
    let ns = NetNs::create("stream").unwrap();
    ns.run(|| {
        let mut ct = Conntrack::open().unwrap();
        let r = ct
            .create(&all, 300, STATUS_SEEN_REPLY | STATUS_ASSURED)
            .unwrap();
        assert_eq!(r.ok, all.len(), "{r:?}");
        let mut state = PassState {
            delete_batch: 7,
            ..PassState::seen_all()
        };
        let r = run_pass(
            &mut Kernel::default(),
            V4,
            &model,
            &mut state,
            Instant::now(),
        )
        .unwrap();
        assert_eq!(
            (
                r.scanned,
                r.stale,
                r.deleted,
                r.already_gone,
                r.failed_deletes
            ),
            (all.len(), gone.len(), gone.len(), 0, 0)
        );
        let mut left = BTreeSet::new();
        ct.dump(V4, None, &mut |e| {
            left.insert(Entry { id: None, ..*e });
        })
        .unwrap();
        assert!(left == keep, "kept {} of {}", left.len(), keep.len());
    })
    .unwrap();
}
