//! The per-source table: its caps hold over generated sequences, a new connection is admitted
//! or closed at once (never queued), and what it may replace.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use testkit::rng::Rng;

use super::sources::{Caps, Id, Refusal, Stage, Table};

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
}

fn caps() -> Caps {
    Caps {
        connections: 8,
        source_connections: 4,
        handshakes: 4,
        source_handshakes: 2,
    }
}

/// A caller that keeps opening connections and never speaks holds no more than its share of
/// handshakes: each new one replaces its oldest silent one at once, so its last connection is
/// always in, and nothing waits.
#[test]
fn silent_connections_are_replaced_oldest_first_never_queued() {
    let mut t = Table::new(caps());
    let mut ids = Vec::new();
    for n in 0..100u32 {
        let (id, gone) = t.admit(ip(1), Stage::Silent, n).unwrap();
        ids.push(id);
        assert_eq!(
            t.held_by(ip(1)),
            (n.min(1) as usize + 1, n.min(1) as usize + 1)
        );
        if n >= 2 {
            assert_eq!(gone, vec![n - 2], "the oldest silent one goes");
        } else {
            assert!(gone.is_empty());
        }
    }
    // Once its connections speak, the source's next one is closed instead (their handshakes
    // run to their deadline, bounded).
    let last = &ids[ids.len() - 2..];
    for id in last {
        t.set(*id, Stage::Handshake);
    }
    assert_eq!(
        t.admit(ip(1), Stage::Silent, 0).map(|_| ()),
        Err(Refusal::SourceHandshakes)
    );
    // Another source is not touched by any of this.
    assert!(t.admit(ip(2), Stage::Silent, 0).unwrap().1.is_empty());
}

/// At its connection cap, a source's new connection replaces one of its own that waits for a
/// request; one answering requests only is never replaced, and the new one is closed.
#[test]
fn a_source_at_its_connection_cap_replaces_its_idle_never_its_busy() {
    let mut t = Table::new(caps());
    let mut ids = Vec::new();
    for n in 0..4 {
        let (id, _) = t.admit(ip(1), Stage::Idle, n).unwrap();
        ids.push(id);
    }
    t.set(ids[0], Stage::Busy);
    t.set(ids[2], Stage::Busy);
    let (fifth, gone) = t.admit(ip(1), Stage::Idle, 4).unwrap();
    assert_eq!(gone, vec![1]);
    let (sixth, gone) = t.admit(ip(1), Stage::Idle, 5).unwrap();
    assert_eq!(gone, vec![3]);
    t.set(fifth, Stage::Busy);
    t.set(sixth, Stage::Busy);
    assert_eq!(
        t.admit(ip(1), Stage::Idle, 6).map(|_| ()),
        Err(Refusal::SourceConnections)
    );
    assert_eq!(t.held_by(ip(1)), (4, 0));
}

/// At the server's cap, a source holding none gets in by replacing a connection of the source
/// holding the most; a source holding as many as every other does is closed instead.
#[test]
fn at_the_server_cap_the_heaviest_source_gives_way() {
    let mut t = Table::new(Caps {
        connections: 6,
        source_connections: 4,
        handshakes: 6,
        source_handshakes: 4,
    });
    for n in 0..4 {
        t.admit(ip(1), Stage::Idle, (1, n)).unwrap();
    }
    t.admit(ip(2), Stage::Idle, (2, 0)).unwrap();
    t.admit(ip(2), Stage::Idle, (2, 1)).unwrap();
    let (_, gone) = t.admit(ip(3), Stage::Idle, (3, 0)).unwrap();
    assert_eq!(gone, vec![(1, 0)], "the heaviest source's oldest idle one");
    assert_eq!(t.held(), (6, 0));
    // ip(2) holds 2, ip(1) 3: ip(2) may take from ip(1); then ip(2) holds the most, 3, and
    // takes from no one.
    let (_, gone) = t.admit(ip(2), Stage::Idle, (2, 2)).unwrap();
    assert_eq!(gone, vec![(1, 1)]);
    assert_eq!(
        t.admit(ip(2), Stage::Idle, (2, 9)).map(|_| ()),
        Err(Refusal::Connections)
    );
    // A busy connection is not taken, even from the heaviest: the next oldest is.
    t.set(4, Stage::Busy); // (2, 0): ids count the connections admitted
    let (_, gone) = t.admit(ip(4), Stage::Idle, (4, 0)).unwrap();
    assert_eq!(gone, vec![(2, 1)]);
    // IPv4 mapped into IPv6 is the same source.
    let mapped = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 3).to_ipv6_mapped());
    assert_eq!(super::sources::source(mapped), ip(3));
    assert_ne!(
        super::sources::source(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ip(3)
    );
}

/// Over generated sequences of connections opening, moving through their stages and closing,
/// from a few sources: the caps hold after every step; a connection answering a request is
/// never replaced; a new connection replaces only the oldest idle or silent one of its own
/// source, or one of a source holding more than its own; and it is closed only when nothing
/// it may replace exists. In particular a source holding nothing is turned away only when every
/// connection is answering a request (or, for a handshake, speaking).
#[test]
fn caps_hold_and_replacements_follow_the_rule_over_generated_sequences() {
    let stages = [Stage::Silent, Stage::Idle, Stage::Handshake, Stage::Busy];
    // How often each outcome came up over all seeds: none may be missing.
    let (mut own, mut others, mut refused) = (0, 0, 0);
    for seed in 0..300u64 {
        let mut rng = Rng(seed);
        let caps = Caps {
            connections: 1 + rng.below(12),
            source_connections: 1 + rng.below(6),
            handshakes: 1 + rng.below(8),
            source_handshakes: 1 + rng.below(4),
        };
        // The payload of each connection is its table id, learnt once admitted.
        let mut t: Table<std::rc::Rc<std::cell::Cell<Id>>> = Table::new(caps);
        // The model: every connection's table id, source and stage.
        let mut open: Vec<(Id, IpAddr, Stage)> = Vec::new();
        for step in 0..400 {
            let why = format!("seed {seed} step {step} {caps:?}");
            match rng.below(10) {
                0..=4 => {
                    let source = ip(rng.below(5) as u8);
                    let stage = if rng.chance(50) {
                        Stage::Silent
                    } else {
                        Stage::Idle
                    };
                    let before = open.clone();
                    let held = |s: IpAddr, hs: bool| {
                        before
                            .iter()
                            .filter(|c| c.1 == s && (!hs || c.2.handshaking()))
                            .count()
                    };
                    let payload = std::rc::Rc::new(std::cell::Cell::new(Id::MAX));
                    match t.admit(source, stage, payload.clone()) {
                        Ok((id, gone)) => {
                            payload.set(id);
                            for g in gone.iter().map(|g| g.get()) {
                                let (_, s, st) = *before.iter().find(|c| c.0 == g).unwrap();
                                assert_ne!(st, Stage::Busy, "{why}: a busy one replaced");
                                if s == source {
                                    own += 1;
                                } else {
                                    others += 1;
                                    assert!(
                                        held(s, false) > held(source, false)
                                            || held(s, true) > held(source, true),
                                        "{why}: replaced one of a source holding no more"
                                    );
                                }
                                open.retain(|c| c.0 != g);
                            }
                            open.push((id, source, stage));
                        }
                        Err(r) => {
                            refused += 1;
                            // Nothing it could replace: check against the model.
                            let replaceable = |c: &&(Id, IpAddr, Stage)| match r {
                                Refusal::SourceHandshakes => c.1 == source && c.2 == Stage::Silent,
                                Refusal::SourceConnections => {
                                    c.1 == source && matches!(c.2, Stage::Silent | Stage::Idle)
                                }
                                Refusal::Handshakes => {
                                    c.1 != source
                                        && c.2.handshaking()
                                        && held(c.1, true) > held(source, true)
                                }
                                Refusal::Connections => {
                                    c.1 != source
                                        && c.2 != Stage::Busy
                                        && held(c.1, false) > held(source, false)
                                }
                            };
                            // A same-source replacement leaves the server under its
                            // connection cap, and the source's handshakes as they were: so
                            // every refusal is checked against the state before.
                            assert!(
                                !before.iter().any(|c| replaceable(&c)),
                                "{why}: refused {r:?} with something to replace"
                            );
                            assert!(
                                !(held(source, true) == 0 && r == Refusal::Handshakes),
                                "{why}: a source handshaking none turned away"
                            );
                            if held(source, false) == 0 && r == Refusal::Connections {
                                assert!(
                                    before.iter().all(|c| c.2 == Stage::Busy),
                                    "{why}: a source holding nothing turned away"
                                );
                            }
                        }
                    }
                }
                5..=7 if !open.is_empty() => {
                    let i = rng.below(open.len());
                    let stage = rng.pick(&stages);
                    // Stages only move forward from a handshake: Silent -> Handshake -> Idle
                    // <-> Busy (a plain connection starts Idle).
                    let from = open[i].2;
                    let allowed = match from {
                        Stage::Silent => stage == Stage::Handshake,
                        Stage::Handshake => stage == Stage::Idle,
                        Stage::Idle => stage == Stage::Busy,
                        Stage::Busy => stage == Stage::Idle,
                    };
                    if allowed {
                        t.set(open[i].0, stage);
                        open[i].2 = stage;
                    }
                }
                _ if !open.is_empty() => {
                    let i = rng.below(open.len());
                    let gone = t.remove(open[i].0).map(|p| p.get());
                    assert_eq!(gone, Some(open[i].0), "{why}");
                    open.remove(i);
                }
                _ => {}
            }
            let handshaking = open.iter().filter(|c| c.2.handshaking()).count();
            assert_eq!(t.held(), (open.len(), handshaking), "{why}");
            assert!(open.len() <= caps.connections, "{why}");
            assert!(handshaking <= caps.handshakes, "{why}");
            for s in 0..5 {
                let (c, h) = t.held_by(ip(s));
                assert!(c <= caps.source_connections, "{why}");
                assert!(h <= caps.source_handshakes, "{why}");
            }
        }
    }
    assert!(
        own > 100 && others > 100 && refused > 100,
        "own {own}, others {others}, refused {refused}"
    );
}
