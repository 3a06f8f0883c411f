//! The rotation's decisions over plain values (`rotation.rs`) and the generations it issues
//! (`generation.rs`): a table of steps, a property over three lifetimes, the Secret's round
//! trip, and real certificates checked by a TLS client's verifier.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use super::generation::{BACKDATE, TLS_KEY, TLS_NOT_AFTER};
use super::rotation::*;
const DAY: Duration = Duration::from_secs(86_400);
const T: Timing = Timing {
    validity: Duration::from_secs(90 * 86_400),
    grace: Duration::from_secs(30),
};

fn at(day: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + day * 86_400).unwrap()
}

fn hosts() -> Vec<String> {
    vec!["gk-webhook.gk.svc".into(), "127.0.0.1".into()]
}

/// A fake generation: `name` stands for its CA, certificate and key; valid for the whole
/// lifetime before `not_after`.
fn fake(name: &str, not_after: Timestamp) -> Generation {
    Generation {
        ca: format!("CA {name}"),
        cert: format!("CERT {name}"),
        key: format!("KEY {name}"),
        not_before: Some(not_after - T.validity),
        not_after,
        hosts: hosts(),
    }
}

/// What the certificate task does: plan, and when a promotion is due, plan again with the
/// apiserver's time (`apiserver`).
fn step_at(
    stored: &Stored,
    hosts: &[String],
    now: Timestamp,
    trusted: impl Fn(&str) -> bool,
    apiserver: Timestamp,
) -> Step {
    match plan(stored, hosts, now, T, &trusted, None) {
        Step::CheckValidity => plan(stored, hosts, now, T, &trusted, Some(apiserver)),
        step => step,
    }
}

#[test]
fn plan_table() {
    let cur = fake("a", at(90));
    let staged = |when| Stored {
        current: Some(cur.clone()),
        next: Some((fake("b", at(150)), when)),
        ..Default::default()
    };
    let trusted_at = |when| Stored {
        next_trusted: Some(when),
        ..staged(at(59))
    };
    let only = Stored {
        current: Some(cur.clone()),
        ..Default::default()
    };
    let grace = jiff::SignedDuration::from_secs(30);
    /// (case, what is stored, hosts wanted, now, the caBundles trust the staged CA, step)
    type Row = (&'static str, Stored, Vec<String>, Timestamp, bool, Step);
    let rows: Vec<Row> = vec![
        (
            "nothing stored",
            Stored::default(),
            hosts(),
            at(0),
            true,
            Step::Issue,
        ),
        (
            "fresh",
            only.clone(),
            hosts(),
            at(1),
            true,
            Step::Wait(at(60)),
        ),
        (
            "a third left: stage",
            only.clone(),
            hosts(),
            at(60),
            true,
            Step::Stage,
        ),
        (
            "expired: issue at once",
            only.clone(),
            hosts(),
            at(90),
            true,
            Step::Issue,
        ),
        (
            "hosts changed: stage",
            only.clone(),
            vec!["other.svc".into()],
            at(1),
            true,
            Step::Stage,
        ),
        (
            "staged, not trusted yet",
            staged(at(60)),
            hosts(),
            at(61),
            false,
            Step::AwaitTrust,
        ),
        (
            "staged, seen trusted: recorded",
            staged(at(60)),
            hosts(),
            at(61),
            true,
            Step::MarkTrusted,
        ),
        (
            "trusted, in the grace since it was seen so (not since staging)",
            trusted_at(at(60)),
            hosts(),
            at(60),
            true,
            Step::Wait(at(60) + grace),
        ),
        (
            "trusted, grace over",
            trusted_at(at(60)),
            hosts(),
            at(61),
            true,
            Step::Promote,
        ),
        (
            "recorded trusted, but an old bundle was written back",
            trusted_at(at(60)),
            hosts(),
            at(61),
            false,
            Step::Untrusted,
        ),
        (
            "hosts annotation lost: the certificate is kept and a renewal staged",
            Stored {
                current: Some(Generation {
                    hosts: vec![],
                    ..cur.clone()
                }),
                ..Default::default()
            },
            hosts(),
            at(1),
            true,
            Step::Stage,
        ),
        (
            "staged for other hosts: stage again",
            staged(at(60)),
            vec!["other.svc".into()],
            at(61),
            true,
            Step::Stage,
        ),
    ];
    for (name, stored, hosts, now, trusted, want) in rows {
        assert_eq!(
            step_at(&stored, &hosts, now, |_| trusted, now),
            want,
            "{name}"
        );
    }
}

/// Over three lifetimes, stepping 10 s to an hour at a time, with the caBundle patched one
/// step after each Secret change (as the apiserver sees it), and now and then an old bundle
/// written back by a replica with a stale view: the certificate served is never expired,
/// always signed by a CA the caBundle already held, and promoted only once the caBundle has
/// held its CA for the whole grace.
#[test]
fn the_served_certificate_is_always_trusted_and_valid() {
    let mut rng = testkit::rng::Rng(7);
    let mut stored = Stored::default();
    let mut bundle_seen = String::new();
    // Since when the caBundle has held each CA without a break.
    let mut held_since: BTreeMap<String, Timestamp> = BTreeMap::new();
    let mut n = 0;
    let mut now = at(0);
    while now < at(270) {
        // The apiserver's clock, up to two backdatings behind or ahead of this replica's.
        let skew = rng.below_u64(4 * BACKDATE.as_secs()) as i64 - 2 * BACKDATE.as_secs() as i64;
        let server = now + jiff::SignedDuration::from_secs(skew);
        let step = step_at(
            &stored,
            &hosts(),
            now,
            |ca| bundle_seen.contains(ca),
            server,
        );
        if step == Step::Promote {
            let (next, staged) = stored.next.as_ref().unwrap();
            assert!(
                server >= valid_from(next, *staged),
                "{now}: promoted a certificate valid from {:?} while the apiserver's clock says {server}",
                next.not_before
            );
            let since = held_since.get(&next.ca).copied();
            assert!(
                since
                    .is_some_and(|s| now.duration_since(s)
                        >= jiff::SignedDuration::try_from(T.grace).unwrap()),
                "{now}: promoted {} held since {since:?}",
                next.ca
            );
        }
        let fresh = matches!(step, Step::Issue | Step::Stage).then(|| {
            n += 1;
            fake(&format!("g{n}"), now + T.validity)
        });
        let next = apply(&stored, &step, now, fresh);
        if let Some(cur) = &next.current {
            assert!(cur.not_after > now, "{now}: serving an expired certificate");
            let was_serving = stored.current.as_ref().map(|g| &g.ca);
            assert!(
                bundle_seen.contains(&cur.ca)
                    || step == Step::Issue
                    || was_serving == Some(&cur.ca),
                "{now}: {step:?} serves {} before the caBundle ({bundle_seen:?}) held it",
                cur.ca
            );
            assert!(
                step != Step::Issue || stored.current.is_none(),
                "{now}: reissued while a valid certificate was served"
            );
        }
        if step == Step::Promote {
            let replaced = &stored.current.as_ref().unwrap().ca;
            assert!(
                next.bundle().contains(replaced),
                "{now}: the replaced CA left the bundle while replicas may still serve its certificate"
            );
        }
        // The bundle the apiserver holds: the Secret's as of the last step, or now and then
        // an older one a stale replica writes back.
        let stale = rng.chance(5).then(|| bundle_seen.clone());
        bundle_seen = stale.unwrap_or_else(|| stored.bundle());
        held_since.retain(|ca, _| bundle_seen.contains(ca.as_str()));
        for g in [
            stored.current.as_ref(),
            stored.next.as_ref().map(|(g, _)| g),
        ]
        .into_iter()
        .flatten()
        {
            if bundle_seen.contains(&g.ca) {
                held_since.entry(g.ca.clone()).or_insert(now);
            }
        }
        stored = next;
        now += Duration::from_secs(*[10, 20, 60, 3600].get(rng.below(4)).unwrap());
    }
    assert!(n >= 4, "renewed {n} times");
    assert!(stored.bundle().lines().count() <= 3);
}

#[test]
fn the_secret_round_trips_and_an_incomplete_one_is_reissued() {
    let stored = Stored {
        current: Some(fake("a", at(90))),
        next: Some((fake("b", at(150)), at(60))),
        next_trusted: Some(at(61)),
        previous_ca: Some("CA z".into()),
    };
    let (data, annotations) = stored.write();
    assert_eq!(Stored::read(&data, &annotations), stored);
    assert_eq!(
        String::from_utf8(data[CA_BUNDLE].clone()).unwrap(),
        "CA z\nCA a\nCA b\n"
    );
    let mut broken = annotations.clone();
    broken.insert(TLS_NOT_AFTER.into(), "soon".into());
    assert_eq!(Stored::read(&data, &broken).current, None);
    assert_eq!(
        plan(
            &Stored::read(&data, &broken),
            &hosts(),
            at(1),
            T,
            |_| true,
            None
        ),
        Step::Issue
    );
    let mut no_key = data.clone();
    no_key.remove(TLS_KEY);
    assert_eq!(Stored::read(&no_key, &annotations).current, None);
}

/// A real generation: the certificate chains to its CA for each host, for a TLS client.
#[test]
fn issued_certificates_verify_against_their_ca() {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
    let g = issue(&hosts(), Timestamp::now(), DAY).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(g.ca.as_bytes()).unwrap())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .unwrap();
    let leaf = CertificateDer::from_pem_slice(g.cert.as_bytes()).unwrap();
    for host in ["gk-webhook.gk.svc", "127.0.0.1"] {
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from(host).unwrap(),
                &[],
                UnixTime::now(),
            )
            .unwrap_or_else(|e| panic!("{host}: {e}"));
    }
    assert!(
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from("evil.svc").unwrap(),
                &[],
                UnixTime::now()
            )
            .is_err()
    );
    // Another generation's CA does not vouch for it.
    let other = issue(&hosts(), Timestamp::now(), DAY).unwrap();
    assert_ne!(other.ca, g.ca);
    assert!(g.not_after > Timestamp::now() && g.not_after <= Timestamp::now() + DAY);
}

/// A staged certificate is promoted only once the apiserver's clock has reached its notBefore:
/// the time is asked for only when a promotion is due, a clock behind it holds the promotion
/// back, and a Secret without the annotation counts from when it was staged.
#[test]
fn a_certificate_not_yet_valid_by_the_apiserver_is_not_promoted() {
    let valid_from_at = at(60) + jiff::SignedDuration::from_hours(2);
    let mut next = fake("b", at(150));
    next.not_before = Some(valid_from_at);
    let stored = Stored {
        current: Some(fake("a", at(90))),
        next: Some((next, at(59))),
        next_trusted: Some(at(60)),
        ..Default::default()
    };
    let now = at(61);
    let second = jiff::SignedDuration::from_secs(1);
    for (case, apiserver, want) in [
        ("time not read yet: ask", None, Step::CheckValidity),
        (
            "a second before notBefore",
            Some(valid_from_at - second),
            Step::NotYetValid,
        ),
        ("at notBefore", Some(valid_from_at), Step::Promote),
        ("after", Some(now), Step::Promote),
    ] {
        assert_eq!(
            plan(&stored, &hosts(), now, T, |_| true, apiserver),
            want,
            "{case}"
        );
    }
    // Not due yet by this replica's clock (in the grace): the apiserver is not asked.
    let in_grace = at(60) + second;
    assert_eq!(
        plan(&stored, &hosts(), in_grace, T, |_| true, None),
        Step::Wait(at(60) + jiff::SignedDuration::from_secs(30))
    );
    // Written without notBefore: valid from when it was staged, at the latest.
    let mut old = stored.clone();
    old.next.as_mut().unwrap().0.not_before = None;
    assert_eq!(
        plan(&old, &hosts(), now, T, |_| true, Some(at(59) - second)),
        Step::NotYetValid
    );
    assert_eq!(
        plan(&old, &hosts(), now, T, |_| true, Some(at(59))),
        Step::Promote
    );
}

/// The backdating is the skew bound: an apiserver whose clock is behind the issuing replica's
/// by up to `BACKDATE` accepts a certificate issued now, and the notBefore the Secret records
/// is the certificate's own.
#[test]
fn backdating_covers_the_skew_bound() {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
    let now = Timestamp::now();
    let g = issue(&hosts(), now, Duration::from_secs(86_400)).unwrap();
    let recorded = g.not_before.expect("issued certificates record notBefore");
    assert!(
        recorded <= now - BACKDATE
            && (now - BACKDATE).duration_since(recorded) < jiff::SignedDuration::from_secs(1)
    );
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(g.ca.as_bytes()).unwrap())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .unwrap();
    let leaf = CertificateDer::from_pem_slice(g.cert.as_bytes()).unwrap();
    let at = |t: Timestamp| UnixTime::since_unix_epoch(Duration::from_secs(t.as_second() as u64));
    let verify = |t: Timestamp| {
        verifier.verify_server_cert(
            &leaf,
            &[],
            &ServerName::try_from("gk-webhook.gk.svc").unwrap(),
            &[],
            at(t),
        )
    };
    let behind = now - BACKDATE + jiff::SignedDuration::from_secs(1);
    assert!(
        verify(behind).is_ok(),
        "an apiserver just within the bound behind accepts it"
    );
    assert!(
        verify(recorded).is_ok(),
        "valid from the recorded notBefore"
    );
    assert!(
        verify(recorded - jiff::SignedDuration::from_secs(1)).is_err(),
        "not before it: the recorded notBefore is the certificate's"
    );
}

/// The `Date` header as an apiserver writes it.
#[test]
fn the_apiserver_time_is_read_off_a_date_header() {
    use super::apply::http_date;
    assert_eq!(
        http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
        Some("1994-11-06T08:49:37Z".parse().unwrap())
    );
    assert_eq!(http_date("yesterday"), None);
}
