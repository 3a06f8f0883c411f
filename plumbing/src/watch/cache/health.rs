//! Whether a component may act on what its cache shows: the one answer every destructive pass
//! asks for, read from the watches' health epochs ([`ReadyFlag::health`]).
//!
//! Why epochs and not "is every watch healthy now": a pass decides on what it read at one
//! moment and writes later (PodGC's deletions at a low QPS, a conntrack pass over a big table).
//! A watch that failed and relisted in between is healthy again at the write, yet what was read
//! before may miss a node that came back or an endpoint that returned. So what was read carries
//! the epochs it was read at ([`Seen`]), and acting needs the same epochs, all healthy, now.
//!
//! Every reason a watch stops being current (not listed yet, an error, a relist under way, a
//! watch silent past `--watch-silent-after`, or any later detector that fails its flag) turns
//! its epoch to `None` through the flag, so each of them stops every pass here, once.

use std::{fmt, sync::Arc};

use crate::ReadyFlag;

/// The watches a component's cache is filled from.
#[derive(Clone, Default)]
pub struct Health {
    flags: Arc<[ReadyFlag]>,
}

/// The watches' health epochs when the cache was read: what was seen is only as current as
/// these. `None` is a watch that was not healthy then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen(Box<[Option<u64>]>);

/// Why what was seen may not be acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// A watch had not listed, was failing or relisting when the cache was read, or is now.
    #[error("a watch has not listed yet, is failing or is relisting")]
    NotHealthy,
    /// Every watch is healthy, but one failed or relisted since the cache was read.
    #[error("a watch failed or relisted since the cache was read")]
    ChangedSince,
}

impl Seen {
    /// Epochs as plain values (a test's fake watches).
    pub fn from_epochs(epochs: impl IntoIterator<Item = Option<u64>>) -> Self {
        Self(epochs.into_iter().collect())
    }

    /// Every watch was healthy when this was read.
    pub fn is_current(&self) -> bool {
        self.0.iter().all(Option::is_some)
    }

    /// The rule: what was read at `self` may be acted on when the watches are at `now` only
    /// when every watch was healthy then, is healthy now, and none failed or relisted between.
    pub fn may_act(&self, now: &Seen) -> Result<(), Stale> {
        if !self.is_current() || !now.is_current() || self.0.len() != now.0.len() {
            Err(Stale::NotHealthy)
        } else if self != now {
            Err(Stale::ChangedSince)
        } else {
            Ok(())
        }
    }
}

impl Health {
    pub fn new(flags: impl IntoIterator<Item = ReadyFlag>) -> Self {
        Self {
            flags: flags.into_iter().collect(),
        }
    }

    /// The epochs now: take this before reading the cache, and pass it to [`Health::may_act`]
    /// before each write decided on what was read.
    pub fn seen(&self) -> Seen {
        Seen(self.flags.iter().map(ReadyFlag::health).collect())
    }

    /// "May I act on what I saw at `seen`?"
    pub fn may_act(&self, seen: &Seen) -> Result<(), Stale> {
        seen.may_act(&self.seen())
    }

    /// Every watch is healthy now: what is read now is current.
    pub fn is_current(&self) -> bool {
        self.seen().is_current()
    }

    /// Every watch has listed once (start-up; a later failure does not undo it).
    pub fn listed(&self) -> bool {
        self.flags.iter().all(ReadyFlag::is_ready)
    }

    /// The watches that are not healthy, each with how long, for a skip warning.
    pub fn unhealthy(&self) -> Vec<String> {
        self.flags
            .iter()
            .filter(|f| !f.is_healthy())
            .map(|f| format!("{} ({:?})", f.name(), f.stale_for()))
            .collect()
    }
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.flags.iter().map(ReadyFlag::name))
            .finish()
    }
}
