//! The serving certificate the controller-manager issues for itself (chart value
//! `certificates: self-signed`): what its Secret holds, and when to issue, stage and promote.
//!
//! Each generation is a fresh CA with one serving certificate signed by it; the CA's key is
//! dropped once the certificate is signed, so the Secret holds no key that can sign anything.
//! A renewal is staged first: the next generation's CA joins `ca.crt` (which every webhook of
//! the ValidatingWebhookConfiguration gets as its caBundle) while the current certificate is
//! still served. It is promoted to `tls.crt` only once the apiserver trusts it (every webhook's
//! caBundle holds it, as this controller observed and recorded in the Secret) and a grace period
//! has passed since that observation for the apiserver to load it. The CA of the
//! generation it replaces stays in the bundle until the next renewal, for replicas that have
//! not yet loaded the new certificate. So no replica ever serves a certificate the apiserver
//! does not trust. Nor one the apiserver would find not yet valid: a staged certificate is
//! promoted only once the apiserver's own clock (read off a response's `Date` header) has
//! reached its notBefore.

use std::time::Duration;

use jiff::Timestamp;

pub use super::generation::{
    Annotations, CA_BUNDLE, Data, Generation, Stored, TLS_CRT, TLS_KEY, TLS_NOT_AFTER, issue,
};

/// How long certificates live and how long a staged one waits.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// A generation's lifetime; renewal is staged with a third of it left.
    pub validity: Duration,
    /// How long a staged generation's CA is in the caBundle before it is served.
    pub grace: Duration,
}

/// What to do with the Secret now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// No usable current generation (none, incomplete, expired): issue one and serve it at
    /// once; there is nothing being served to protect.
    Issue,
    /// Renewal is due (or the hosts changed): stage the next generation.
    Stage,
    /// The staged generation is trusted and its grace has passed: serve it.
    Promote,
    /// The caBundles hold the staged CA (first seen now, or again after losing it): record
    /// when, for the grace to count from.
    MarkTrusted,
    /// The caBundles no longer hold the staged CA although it was recorded trusted (a stale
    /// write put an old bundle back): forget that, so the grace counts anew once they do.
    Untrusted,
    /// Nothing before this time, unless something changes.
    Wait(Timestamp),
    /// The staged CA is not in every webhook's caBundle yet: wait for the patch to show.
    AwaitTrust,
    /// Promotion is due by this replica's clock: read the apiserver's time and plan again
    /// with it.
    CheckValidity,
    /// The staged certificate is not valid yet by the apiserver's clock (this replica's clock
    /// is ahead of it by more than the backdating): not served until it is.
    NotYetValid,
}

/// The step for what is stored, the hosts wanted and the time; `trusted(ca)` says whether the
/// webhook configuration's caBundles hold `ca`; `apiserver` is the apiserver's time when it
/// was read (asked for by [`Step::CheckValidity`]).
pub fn plan(
    stored: &Stored,
    hosts: &[String],
    now: Timestamp,
    t: Timing,
    trusted: impl Fn(&str) -> bool,
    apiserver: Option<Timestamp>,
) -> Step {
    let Some(current) = &stored.current else {
        return Step::Issue;
    };
    if current.not_after <= now {
        return Step::Issue;
    }
    let renew_at = current.not_after - t.validity / 3;
    match &stored.next {
        // Staged for other hosts, or left staged so long it expired: stage again.
        Some((next, _)) if next.hosts != hosts || next.not_after <= now => Step::Stage,
        Some((next, staged)) => match (trusted(&next.ca), stored.next_trusted) {
            (false, None) => Step::AwaitTrust,
            (false, Some(_)) => Step::Untrusted,
            (true, None) => Step::MarkTrusted,
            (true, Some(since)) if now < since + t.grace => Step::Wait(since + t.grace),
            (true, Some(_)) => match apiserver {
                None => Step::CheckValidity,
                Some(server) if server < valid_from(next, *staged) => Step::NotYetValid,
                Some(_) => Step::Promote,
            },
        },
        None if now >= renew_at || current.hosts != hosts => Step::Stage,
        None => Step::Wait(renew_at),
    }
}

/// When `g` is valid from; a Secret written without the annotation says only when it was
/// staged, which is no earlier than it was issued (so later than its notBefore).
pub fn valid_from(g: &Generation, staged: Timestamp) -> Timestamp {
    g.not_before.unwrap_or(staged)
}

/// What is stored after `step`; Issue and Stage take the `fresh` generation (without one,
/// nothing changes).
pub fn apply(stored: &Stored, step: &Step, now: Timestamp, fresh: Option<Generation>) -> Stored {
    match (step, fresh) {
        (Step::Issue, Some(fresh)) => Stored {
            current: Some(fresh),
            ..Stored::default()
        },
        (Step::Stage, Some(fresh)) => Stored {
            current: stored.current.clone(),
            next: Some((fresh, now)),
            ..Stored::default()
        },
        (Step::Promote, _) if stored.next.is_some() => Stored {
            previous_ca: stored.current.as_ref().map(|g| g.ca.clone()),
            current: stored.next.as_ref().map(|(g, _)| g.clone()),
            ..Stored::default()
        },
        (Step::MarkTrusted, _) if stored.next.is_some() => Stored {
            next_trusted: Some(now),
            ..stored.clone()
        },
        (Step::Untrusted, _) => Stored {
            next_trusted: None,
            ..stored.clone()
        },
        _ => stored.clone(),
    }
}
