//! Who holds a server's connections, by source address: the caps per source and in all, and
//! what a new connection gets at a cap. Pure: the listener asks, and closes what it is told to.
//!
//! A new connection is never queued. At a cap it either takes the place of a connection that
//! is doing nothing (one that has sent nothing yet, or waits for a request) or is closed at
//! once:
//!
//! - at its own source's cap, it replaces that source's oldest connection that has sent
//!   nothing yet (or, for the connection cap, one waiting for a request): a caller's silent
//!   connections never keep out its next one that speaks;
//! - at the server's cap, it replaces a connection of the source holding the most, when that
//!   source holds more than the new connection's own: so a source holding none (kubelet, whose
//!   probes each open a connection of their own) always gets in while some connection anywhere
//!   is not answering a request.
//!
//! A connection answering a request is never replaced: the request's own deadlines bound it.

use std::collections::HashMap;
use std::net::IpAddr;

/// A connection's place in the [`Table`].
pub type Id = u64;

/// Where a connection is. The order is the order of preference for replacing one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Accepted, nothing received yet (TLS: no ClientHello).
    Silent,
    /// Waiting for a request: before its headers are complete, or kept alive between requests.
    Idle,
    /// A TLS handshake the caller has started.
    Handshake,
    /// A request being received or answered; never replaced.
    Busy,
}

impl Stage {
    /// Whether the connection holds one of the handshakes in progress.
    pub fn handshaking(self) -> bool {
        matches!(self, Stage::Silent | Stage::Handshake)
    }
}

/// The caps of a [`Table`]; each at least 1.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    pub connections: usize,
    pub source_connections: usize,
    pub handshakes: usize,
    pub source_handshakes: usize,
}

/// Why a new connection was closed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its source holds its share of connections, none of them idle.
    SourceConnections,
    /// Its source holds its share of handshakes, none of them silent.
    SourceHandshakes,
    /// The server holds its cap of connections, none it may replace.
    Connections,
    /// The server holds its cap of handshakes, none it may replace.
    Handshakes,
}

impl Refusal {
    /// The `reason` label it is counted under.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::SourceConnections => "source_connections",
            Refusal::SourceHandshakes => "source_handshakes",
            Refusal::Connections => "connections",
            Refusal::Handshakes => "handshakes",
        }
    }
}

struct Conn<T> {
    source: IpAddr,
    stage: Stage,
    payload: T,
}

#[derive(Clone, Copy, Default)]
struct Held {
    connections: usize,
    handshakes: usize,
}

/// The connections open, each with its source, its stage and a payload of the caller's (the
/// listener's: how to close it).
pub struct Table<T> {
    caps: Caps,
    conns: HashMap<Id, Conn<T>>,
    sources: HashMap<IpAddr, Held>,
    handshakes: usize,
    next: Id,
}

/// The source a connection is counted under: an IPv4 address mapped into IPv6 counts as itself.
pub fn source(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

impl<T> Table<T> {
    pub fn new(caps: Caps) -> Self {
        let caps = Caps {
            connections: caps.connections.max(1),
            source_connections: caps.source_connections.max(1),
            handshakes: caps.handshakes.max(1),
            source_handshakes: caps.source_handshakes.max(1),
        };
        Self {
            caps,
            conns: HashMap::new(),
            sources: HashMap::new(),
            handshakes: 0,
            next: 0,
        }
    }

    /// A new connection from `source`, starting in `stage` (`Silent` for TLS, `Idle` for plain
    /// HTTP): its id and the payloads of the connections it replaces (already out of the
    /// table: close them), or why it is closed.
    pub fn admit(
        &mut self,
        source: IpAddr,
        stage: Stage,
        payload: T,
    ) -> Result<(Id, Vec<T>), Refusal> {
        let victims = self.victims(source, stage.handshaking())?;
        let gone = victims.into_iter().filter_map(|v| self.remove(v)).collect();
        let id = self.next;
        self.next += 1;
        self.conns.insert(
            id,
            Conn {
                source,
                stage,
                payload,
            },
        );
        let held = self.sources.entry(source).or_default();
        held.connections += 1;
        if stage.handshaking() {
            held.handshakes += 1;
            self.handshakes += 1;
        }
        Ok((id, gone))
    }

    /// The connections a new one from `source` must replace to get in, or why it can not.
    fn victims(&self, source: IpAddr, handshaking: bool) -> Result<Vec<Id>, Refusal> {
        let caps = self.caps;
        let mut own = self.sources.get(&source).copied().unwrap_or_default();
        let (mut connections, mut handshakes) = (self.conns.len(), self.handshakes);
        let mut victims = Vec::new();
        let own_handshakes_full = handshaking && own.handshakes >= caps.source_handshakes;
        if own_handshakes_full || own.connections >= caps.source_connections {
            let (stages, refusal): (&[Stage], _) = if own_handshakes_full {
                (&[Stage::Silent], Refusal::SourceHandshakes)
            } else {
                (&[Stage::Silent, Stage::Idle], Refusal::SourceConnections)
            };
            let v = self.oldest(source, stages).ok_or(refusal)?;
            own.connections -= 1;
            connections -= 1;
            if self.conns[&v].stage.handshaking() {
                own.handshakes -= 1;
                handshakes -= 1;
            }
            victims.push(v);
        }
        let handshakes_full = handshaking && handshakes >= caps.handshakes;
        if handshakes_full || connections >= caps.connections {
            let (stages, refusal): (&[Stage], _) = if handshakes_full {
                (&[Stage::Silent, Stage::Handshake], Refusal::Handshakes)
            } else {
                (
                    &[Stage::Silent, Stage::Idle, Stage::Handshake],
                    Refusal::Connections,
                )
            };
            let count = |h: &Held| {
                if handshakes_full {
                    h.handshakes
                } else {
                    h.connections
                }
            };
            let mut heavier: Vec<(&IpAddr, usize)> = self
                .sources
                .iter()
                .filter(|(s, _)| **s != source)
                .map(|(s, h)| (s, count(h)))
                .filter(|(_, n)| *n > count(&own))
                .collect();
            heavier.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            let v = heavier
                .iter()
                .find_map(|(s, _)| self.oldest(**s, stages))
                .ok_or(refusal)?;
            victims.push(v);
        }
        Ok(victims)
    }

    /// The connection of `source` to replace first among those in `stages`: the earliest stage
    /// in [`Stage`]'s order, then the oldest.
    fn oldest(&self, source: IpAddr, stages: &[Stage]) -> Option<Id> {
        self.conns
            .iter()
            .filter(|(_, c)| c.source == source && stages.contains(&c.stage))
            .min_by_key(|(id, c)| (c.stage, **id))
            .map(|(id, _)| *id)
    }

    /// Moves a connection to `stage`; nothing if it is gone (replaced).
    pub fn set(&mut self, id: Id, stage: Stage) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let was = c.stage.handshaking();
        c.stage = stage;
        let held = self
            .sources
            .get_mut(&c.source)
            .expect("a source per connection");
        match (was, stage.handshaking()) {
            (true, false) => {
                held.handshakes -= 1;
                self.handshakes -= 1;
            }
            (false, true) => {
                held.handshakes += 1;
                self.handshakes += 1;
            }
            _ => {}
        }
    }

    /// Takes a connection out (it closed); its payload, or None if it was replaced before.
    pub fn remove(&mut self, id: Id) -> Option<T> {
        let c = self.conns.remove(&id)?;
        let held = self
            .sources
            .get_mut(&c.source)
            .expect("a source per connection");
        held.connections -= 1;
        if c.stage.handshaking() {
            held.handshakes -= 1;
            self.handshakes -= 1;
        }
        if held.connections == 0 {
            self.sources.remove(&c.source);
        }
        Some(c.payload)
    }

    /// Connections open, and of them handshaking.
    pub fn held(&self) -> (usize, usize) {
        (self.conns.len(), self.handshakes)
    }

    /// Connections and handshakes `source` holds.
    pub fn held_by(&self, source: IpAddr) -> (usize, usize) {
        let h = self.sources.get(&source).copied().unwrap_or_default();
        (h.connections, h.handshakes)
    }

    /// The stage of a connection still in the table.
    pub fn stage(&self, id: Id) -> Option<Stage> {
        self.conns.get(&id).map(|c| c.stage)
    }
}

/// A count per source with a cap, for what is held a while (requests in flight): `take` gives
/// a [`Taken`] that counts until dropped.
#[derive(Default)]
pub struct Tally {
    held: std::sync::Mutex<HashMap<IpAddr, usize>>,
}

impl Tally {
    /// One more for `source`, if it holds fewer than `cap`.
    pub fn take(self: &std::sync::Arc<Self>, source: IpAddr, cap: usize) -> Option<Taken> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(source).or_default();
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(Taken {
            tally: self.clone(),
            source,
        })
    }

    pub fn held_by(&self, source: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&source).copied().unwrap_or_default()
    }
}

/// One taken from a [`Tally`], given back when dropped.
pub struct Taken {
    tally: std::sync::Arc<Tally>,
    source: IpAddr,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut held = self.tally.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.source);
            }
        }
    }
}
