//! Tests of one pass against a fake table: retries, aborts, fallbacks and what is deleted.

use std::collections::HashSet;
use std::net::IpAddr;

use std::io;
use std::time::Instant;

use crate::conntrack::apply::{Delete, DryRun, Dump, Table};
use crate::conntrack::decide::Stale;
use crate::conntrack::model::FamilyModel;
use crate::conntrack::model::focus::Scope;
use crate::conntrack::netlink::family::Family::V4;
use crate::conntrack::netlink::msg::{Entry, IPPROTO_TCP, IPPROTO_UDP, Tuple};
use crate::conntrack::netlink::socket::{BatchReport, DumpError};
use crate::conntrack::pass::*;
use crate::conntrack::test_support::{dumps, sa};

pub(super) fn flow(proto: u8, client_port: u16, backend: &str) -> Entry {
    let b = sa(backend);
    let c: std::net::IpAddr = "10.0.0.1".parse().unwrap();
    Entry {
        orig: Tuple {
            src: c,
            dst: "10.96.0.10".parse().unwrap(),
            proto,
            src_port: client_port,
            dst_port: 53,
        },
        reply: Tuple {
            src: b.ip(),
            dst: c,
            proto,
            src_port: b.port(),
            dst_port: client_port,
        },
        id: Some(client_port as u32),
        zone: 0,
    }
}

pub(super) fn model() -> FamilyModel {
    let mut m = FamilyModel::default();
    m.frontends
        .insert(sa("10.96.0.10:53"), [sa("10.244.1.5:53")].into());
    m
}

/// Per dump attempt: how many entries to visit, then the result.
pub(super) type Script = Vec<(usize, Result<(), fn() -> DumpError>)>;

/// Scripted dump results, one per attempt; records deletes.
pub(super) struct Fake {
    entries: Vec<Entry>,
    script: Script,
    attempts: usize,
    filters: Vec<Option<u8>>,
    deleted: Vec<Entry>,
    pub(super) delete_result: Option<fn() -> io::Error>,
    host: Option<Vec<&'static str>>,
    /// The kernel rejects the filter on the reply source.
    reply_filter_rejected: bool,
    reply_dumps: usize,
}

impl Fake {
    pub(super) fn new(entries: Vec<Entry>, script: Script) -> Self {
        Self {
            entries,
            script,
            attempts: 0,
            filters: vec![],
            deleted: vec![],
            delete_result: None,
            host: Some(vec![]),
            reply_filter_rejected: false,
            reply_dumps: 0,
        }
    }
}

impl Table for Fake {
    fn dump(
        &mut self,
        what: Dump,
        visit: &mut dyn FnMut(&Entry, &mut dyn Delete),
    ) -> Result<usize, DumpError> {
        // What the dump returns is read first: deletes while it streams change the table, as
        // in the kernel, not the entries already on their way.
        match what {
            Dump::Whole(_, only_proto) => {
                self.filters.push(only_proto);
                let (n, res) = self.script[self.attempts.min(self.script.len() - 1)];
                self.attempts += 1;
                let read: Vec<Entry> = self.entries.iter().take(n).copied().collect();
                for e in &read {
                    visit(e, self);
                }
                res.map(|()| n).map_err(|f| f())
            }
            Dump::Select(..) => {
                self.reply_dumps += 1;
                if self.reply_filter_rejected {
                    return Err(rejected());
                }
                let read: Vec<Entry> = self
                    .entries
                    .iter()
                    .filter(|e| dumps(what, e))
                    .copied()
                    .collect();
                for e in &read {
                    visit(e, self);
                }
                Ok(read.len())
            }
        }
    }

    fn host_addresses(&mut self) -> io::Result<HashSet<IpAddr>> {
        match &self.host {
            Some(a) => Ok(a.iter().map(|s| s.parse().unwrap()).collect()),
            None => Err(io::Error::from_raw_os_error(libc::EMFILE)),
        }
    }
}

impl Delete for Fake {
    fn delete(&mut self, entries: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        if let Some(f) = self.delete_result {
            return Err(f());
        }
        self.deleted.extend(entries.iter().map(|(e, _)| *e));
        // Gone from the table: a later dump no longer returns them.
        self.entries
            .retain(|x| !entries.iter().any(|(e, _)| e == x));
        Ok(BatchReport {
            ok: entries.len(),
            ..Default::default()
        })
    }
}

fn table() -> Vec<Entry> {
    vec![
        flow(IPPROTO_UDP, 1, "10.244.1.5:53"), // serving
        flow(IPPROTO_UDP, 2, "10.244.9.9:53"), // stale
        flow(IPPROTO_TCP, 3, "10.244.9.9:53"), // TCP: never
        flow(IPPROTO_UDP, 4, "10.244.8.8:53"), // stale
    ]
}

fn interrupted() -> DumpError {
    DumpError::Interrupted
}
fn rejected() -> DumpError {
    DumpError::FilterRejected(io::Error::from_raw_os_error(libc::EINVAL))
}
fn eperm() -> DumpError {
    DumpError::Kernel(io::Error::from_raw_os_error(libc::EPERM))
}

fn run(t: &mut Fake) -> Result<PassReport, PassError> {
    let mut state = PassState::seen_all();
    run_pass(t, V4, &model(), &mut state, Instant::now())
}

/// Records the client ports of what reaches `delete`, then hands it on.
struct Seen<T> {
    inner: T,
    ports: Vec<u16>,
}

impl<T: Table> Table for Seen<T> {
    fn dump(
        &mut self,
        what: Dump,
        visit: &mut dyn FnMut(&Entry, &mut dyn Delete),
    ) -> Result<usize, DumpError> {
        let ports = &mut self.ports;
        self.inner.dump(what, &mut |e, inner| {
            visit(e, &mut Recording { ports, inner })
        })
    }
}

impl<T: Table> Delete for Seen<T> {
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        Recording {
            ports: &mut self.ports,
            inner: &mut self.inner,
        }
        .delete(stale)
    }
}

/// The deletes [`Seen`] hands on, recorded.
struct Recording<'a> {
    ports: &'a mut Vec<u16>,
    inner: &'a mut dyn Delete,
}

impl Delete for Recording<'_> {
    fn delete(&mut self, stale: &[(Entry, Stale)]) -> io::Result<BatchReport> {
        self.ports
            .extend(stale.iter().map(|(e, _)| e.orig.src_port));
        self.inner.delete(stale)
    }
}

#[test]
fn deletes_only_the_stale_udp_entries() {
    let mut t = Fake::new(table(), vec![(4, Ok(()))]);
    let r = run(&mut t).unwrap();
    let ports: Vec<u16> = t.deleted.iter().map(|e| e.orig.src_port).collect();
    assert_eq!(ports, vec![2, 4]);
    assert_eq!((r.scanned, r.stale, r.deleted, r.partial), (4, 2, 2, false));
    assert_eq!(t.filters, vec![Some(IPPROTO_UDP)]);
}

#[test]
fn dry_run_deletes_nothing_but_reports() {
    let mut t = Seen {
        inner: DryRun(Fake::new(table(), vec![(4, Ok(()))])),
        ports: vec![],
    };
    let mut state = PassState::seen_all();
    let r = run_pass(&mut t, V4, &model(), &mut state, Instant::now()).unwrap();
    let (t, seen) = (t.inner.0, t.ports);
    assert!(t.deleted.is_empty());
    assert_eq!(seen, vec![2, 4]);
    assert_eq!((r.stale, r.deleted), (2, 0));
}

#[test]
fn interrupted_dump_is_retried_then_the_last_partial_result_is_used() {
    // Attempts 1-4 interrupted after 1 entry; 5th interrupted after 2: stale port 2 only.
    let mut t = Fake::new(
        table(),
        vec![
            (1, Err(interrupted)),
            (1, Err(interrupted)),
            (1, Err(interrupted)),
            (1, Err(interrupted)),
            (2, Err(interrupted)),
        ],
    );
    let r = run(&mut t).unwrap();
    assert_eq!(r.dump_attempts, MAX_DUMP_ATTEMPTS);
    assert!(r.partial);
    assert_eq!(r.scanned, 2);
    let ports: Vec<u16> = t.deleted.iter().map(|e| e.orig.src_port).collect();
    assert_eq!(ports, vec![2], "only the last attempt's stale entries");
}

#[test]
fn interrupted_then_complete_uses_the_complete_dump_once() {
    let mut t = Fake::new(table(), vec![(3, Err(interrupted)), (4, Ok(()))]);
    let r = run(&mut t).unwrap();
    assert_eq!((r.dump_attempts, r.partial, r.deleted), (2, false, 2));
    assert_eq!(
        t.deleted.len(),
        2,
        "no duplicate from the interrupted attempt"
    );
}

#[test]
fn other_dump_errors_abort_without_deleting() {
    let mut t = Fake::new(table(), vec![(3, Err(eperm))]);
    let e = run(&mut t).unwrap_err();
    assert!(matches!(e, PassError::Dump(DumpError::Kernel(_))), "{e}");
    assert!(t.deleted.is_empty());
    assert_eq!(t.attempts, 1);
}

#[test]
fn rejected_filter_falls_back_to_an_unfiltered_dump_and_stays_off() {
    let mut t = Fake::new(table(), vec![(0, Err(rejected)), (4, Ok(()))]);
    let mut state = PassState::seen_all();
    let r = run_pass(&mut t, V4, &model(), &mut state, Instant::now()).unwrap();
    assert_eq!(t.filters, vec![Some(IPPROTO_UDP), None]);
    assert_eq!(
        r.deleted, 2,
        "TCP entry still untouched without the kernel filter"
    );
    assert!(!state.kernel_filter);
    assert_eq!(r.dump_attempts, 1);
}

#[test]
fn empty_model_does_not_read_the_table() {
    let mut t = Fake::new(table(), vec![(4, Ok(()))]);
    let mut state = PassState::seen_all();
    let r = run_pass(
        &mut t,
        V4,
        &FamilyModel::default(),
        &mut state,
        Instant::now(),
    )
    .unwrap();
    assert!(r.skipped);
    assert_eq!(t.attempts, 0);
}

#[test]
fn delete_error_is_reported_with_the_counts() {
    let mut t = Fake::new(table(), vec![(4, Ok(()))]);
    t.delete_result = Some(|| io::Error::from_raw_os_error(libc::EPERM));
    match run(&mut t) {
        Err(PassError::Delete { report, .. }) => assert_eq!(report.stale, 2),
        other => panic!("{other:?}"),
    }
}

/// Flows to the nodePort 30053 on 192.168.0.7, DNATed (port 1) or not (port 2), none serving.
fn node_port_table() -> (FamilyModel, Vec<Entry>) {
    let mut m = FamilyModel::default();
    m.node_ports.insert(30053, [sa("10.244.1.5:53")].into());
    m.node_ips = ["192.168.0.7".parse().unwrap()].into();
    let c = sa("10.0.0.1:1");
    let dnated = Entry::dnat(IPPROTO_UDP, c, sa("192.168.0.7:30053"), sa("10.244.9.9:53"));
    let local = Entry::dnat(
        IPPROTO_UDP,
        sa("10.0.0.1:2"),
        sa("192.168.0.7:30053"),
        sa("192.168.0.7:30053"),
    );
    (m, vec![dnated, local])
}

#[test]
fn host_addresses_feed_the_node_port_rule_and_a_failed_read_only_narrows_it() {
    // (name, host addresses or a failed read, client ports of the deleted flows)
    type Case = (&'static str, Option<Vec<&'static str>>, Vec<u16>);
    let cases: [Case; 3] = [
        (
            "host owns the address",
            Some(vec!["192.168.0.7"]),
            vec![1, 2],
        ),
        (
            "host does not own it (Node status only)",
            Some(vec![]),
            vec![1],
        ),
        ("reading the host's addresses failed", None, vec![1]),
    ];
    for (name, host, want) in cases {
        let (m, entries) = node_port_table();
        let mut t = Fake::new(entries, vec![(2, Ok(()))]);
        t.host = host;
        let mut state = PassState::seen_all();
        run_pass(&mut t, V4, &m, &mut state, Instant::now()).unwrap();
        let ports: Vec<u16> = t.deleted.iter().map(|e| e.orig.src_port).collect();
        assert_eq!(ports, want, "{name}");
    }
}

#[test]
fn orphaned_service_ips_wait_for_the_grace_then_go() {
    let mut m = FamilyModel {
        service_cidrs: vec![
            crate::conntrack::model::ServiceIpRange::parse("10.96.0.0/16").unwrap(),
        ],
        ..FamilyModel::default()
    };
    // 10.96.0.10 (the table's frontend) has no IPAddress: every DNATed flow to it is orphaned.
    let mut state = PassState {
        orphan_grace: std::time::Duration::from_secs(3600),
        ..PassState::seen_all()
    };
    let mut t = Fake::new(table(), vec![(4, Ok(()))]);
    let r = run_pass(&mut t, V4, &m, &mut state, Instant::now()).unwrap();
    assert_eq!(
        (r.stale, r.orphans_pending, r.deleted),
        (0, 3, 0),
        "first sight"
    );
    let since = state.graces.orphans[&"10.96.0.10".parse::<IpAddr>().unwrap()];
    // The grace has passed (as if the first sight were two hours ago).
    let earlier = since - std::time::Duration::from_secs(7200);
    state
        .graces
        .orphans
        .insert("10.96.0.10".parse().unwrap(), earlier);
    let r = run_pass(&mut t, V4, &m, &mut state, Instant::now()).unwrap();
    assert_eq!((r.stale, r.orphans_pending, r.deleted), (3, 0, 3));
    let ports: Vec<u16> = t.deleted.iter().map(|e| e.orig.src_port).collect();
    assert_eq!(ports, vec![1, 2, 4], "UDP only");
    // Allocated again: forgotten, nothing more deleted.
    m.allocated.insert("10.96.0.10".parse().unwrap());
    let r = run_pass(&mut t, V4, &m, &mut state, Instant::now()).unwrap();
    assert_eq!((r.stale, r.orphans_pending), (0, 0));
    assert!(state.graces.orphans.is_empty());
}

#[test]
fn focused_pass_per_source_or_one_dump_when_the_kernel_rejects_the_filter() {
    let focus = Scope {
        backends: ["10.244.9.9".parse().unwrap()].into(),
        ..Scope::default()
    };
    for rejected in [false, true] {
        let mut t = Fake::new(table(), vec![(4, Ok(()))]);
        t.reply_filter_rejected = rejected;
        let mut state = PassState::seen_all();
        let r = run_focused_pass(
            &mut t,
            V4,
            &model(),
            &mut state,
            Some(&focus),
            Instant::now(),
        )
        .unwrap();
        let ports: Vec<u16> = t.deleted.iter().map(|e| e.orig.src_port).collect();
        assert_eq!(
            ports,
            vec![2],
            "rejected={rejected}: only the focused stale entry"
        );
        assert_eq!(state.select_filter, !rejected, "rejected={rejected}");
        assert_eq!(
            t.attempts,
            usize::from(rejected),
            "one plain dump after a rejection"
        );
        assert_eq!(r.deleted, 1);
        // Later focused passes no longer try the rejected filter.
        let before = t.reply_dumps;
        let mut dry = DryRun(t);
        run_focused_pass(
            &mut dry,
            V4,
            &model(),
            &mut state,
            Some(&focus),
            Instant::now(),
        )
        .unwrap();
        let t = dry.0;
        assert_eq!(t.reply_dumps - before, usize::from(!rejected));
    }
    // An empty focus reads nothing.
    let mut t = Fake::new(table(), vec![(4, Ok(()))]);
    let r = run_focused_pass(
        &mut t,
        V4,
        &model(),
        &mut PassState::seen_all(),
        Some(&Scope::default()),
        Instant::now(),
    )
    .unwrap();
    assert!(r.skipped);
    assert_eq!((t.attempts, t.reply_dumps), (0, 0));
}

#[test]
fn selections_ask_the_kernel_for_the_scope_in_few_walks() {
    use crate::conntrack::netlink::family::Family::V6;
    use crate::conntrack::netlink::filter::Select::{OrigDst, OrigDstPort, ReplySource};
    let scope = |f: &[&str], n: &[u16], b: &[&str]| Scope {
        frontends: f.iter().map(|s| sa(s)).collect(),
        node_ports: n.iter().copied().collect(),
        backends: b.iter().map(|s| s.parse().unwrap()).collect(),
    };
    let v4 = |s: &str| s.parse().unwrap();
    let cases = [
        (
            "one frontend and its removed backend",
            V4,
            scope(&["10.96.0.10:53"], &[], &["10.244.1.5"]),
            Some(vec![
                ReplySource(v4("10.244.1.5")),
                OrigDst(v4("10.96.0.10"), 53),
            ]),
        ),
        (
            "a port with several addresses is one walk on the port",
            V4,
            scope(&["10.96.0.10:53", "192.0.2.1:53"], &[], &[]),
            Some(vec![OrigDstPort(53)]),
        ),
        (
            "a nodePort equal to a frontend port covers it",
            V4,
            scope(&["10.96.0.10:30053"], &[30053], &[]),
            Some(vec![OrigDstPort(30053)]),
        ),
        (
            "an IPv6 backend is not an IPv4 entry's reply source",
            V4,
            scope(&["10.96.0.10:53"], &[], &["fd00::5"]),
            Some(vec![OrigDst(v4("10.96.0.10"), 53)]),
        ),
        (
            "IPv6 frontends by port (the kernel inverts IPv6 address matches)",
            V6,
            scope(&["[fd00::a]:53"], &[30053], &[]),
            Some(vec![OrigDstPort(53), OrigDstPort(30053)]),
        ),
        (
            "an IPv6 backend: one UDP dump filtered here",
            V6,
            scope(&["[fd00::a]:53"], &[], &["fd00::5"]),
            None,
        ),
        (
            "three walks cost more than one UDP dump",
            V4,
            scope(&["10.96.0.10:53"], &[30053], &["10.244.1.5"]),
            None,
        ),
    ];
    for (name, fam, s, want) in cases {
        assert_eq!(selections(fam, &s), want, "{name}");
    }
}
