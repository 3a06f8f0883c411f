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
//! does not trust.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The CAs to trust: the caBundle of every webhook.
pub const CA_BUNDLE: &str = "ca.crt";
/// The certificate and key every replica serves (also what cert-manager writes).
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
const TLS_CA: &str = "tls-ca.crt";
const NEXT_CRT: &str = "next.crt";
const NEXT_KEY: &str = "next.key";
const NEXT_CA: &str = "next-ca.crt";
const PREVIOUS_CA: &str = "previous-ca.crt";
pub const TLS_NOT_AFTER: &str = "groundskeeper.dev/tls-not-after";
const TLS_HOSTS: &str = "groundskeeper.dev/tls-hosts";
const NEXT_NOT_AFTER: &str = "groundskeeper.dev/next-not-after";
const NEXT_HOSTS: &str = "groundskeeper.dev/next-hosts";
const NEXT_STAGED_AT: &str = "groundskeeper.dev/next-staged-at";
const NEXT_TRUSTED_AT: &str = "groundskeeper.dev/next-trusted-at";

/// Certificates are valid from this long before they are issued, for clocks a little behind.
const BACKDATE: Duration = Duration::from_secs(300);

/// One CA and the serving certificate it signed, PEM.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub ca: String,
    pub cert: String,
    pub key: String,
    pub not_after: Timestamp,
    /// The names and addresses the certificate is for.
    pub hosts: Vec<String>,
}

/// What the Secret holds.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Stored {
    pub current: Option<Generation>,
    /// The staged renewal and when it was staged.
    pub next: Option<(Generation, Timestamp)>,
    /// When the webhook configuration was first seen to trust the staged CA (every caBundle
    /// holding it): the promotion grace counts from here.
    pub next_trusted: Option<Timestamp>,
    /// The CA of the generation the current one replaced.
    pub previous_ca: Option<String>,
}

/// Secret data and annotations, as plain maps.
pub type Data = BTreeMap<String, Vec<u8>>;
pub type Annotations = BTreeMap<String, String>;

impl Stored {
    /// Reads what the Secret holds; a generation missing a part, or its expiry, is absent (and
    /// so issued again). Missing hosts read as none: the certificate is still served, and a
    /// renewal for the hosts wanted is staged, trusted, then promoted, as for a change of hosts.
    pub fn read(data: &Data, annotations: &Annotations) -> Self {
        let text = |k: &str| {
            data.get(k)
                .and_then(|v| String::from_utf8(v.clone()).ok())
                .filter(|s| !s.trim().is_empty())
        };
        let time = |k: &str| annotations.get(k).and_then(|v| v.parse::<Timestamp>().ok());
        let hosts = |k: &str| {
            annotations.get(k).map(|v| {
                v.split(',')
                    .filter(|h| !h.is_empty())
                    .map(String::from)
                    .collect()
            })
        };
        let generation = |ca: &str, cert: &str, key: &str, not_after: &str, h: &str| {
            Some(Generation {
                ca: text(ca)?,
                cert: text(cert)?,
                key: text(key)?,
                not_after: time(not_after)?,
                hosts: hosts(h).unwrap_or_default(),
            })
        };
        Stored {
            current: generation(TLS_CA, TLS_CRT, TLS_KEY, TLS_NOT_AFTER, TLS_HOSTS),
            next: generation(NEXT_CA, NEXT_CRT, NEXT_KEY, NEXT_NOT_AFTER, NEXT_HOSTS)
                .zip(time(NEXT_STAGED_AT)),
            next_trusted: time(NEXT_TRUSTED_AT),
            previous_ca: text(PREVIOUS_CA),
        }
    }

    /// The Secret's data and annotations for what is stored.
    pub fn write(&self) -> (Data, Annotations) {
        let mut data = Data::new();
        let mut annotations = Annotations::new();
        let mut put = |g: &Generation, [ca, cert, key, not_after, hosts]: [&str; 5]| {
            data.insert(ca.into(), g.ca.clone().into_bytes());
            data.insert(cert.into(), g.cert.clone().into_bytes());
            data.insert(key.into(), g.key.clone().into_bytes());
            annotations.insert(not_after.into(), g.not_after.to_string());
            annotations.insert(hosts.into(), g.hosts.join(","));
        };
        if let Some(g) = &self.current {
            put(g, [TLS_CA, TLS_CRT, TLS_KEY, TLS_NOT_AFTER, TLS_HOSTS]);
        }
        if let Some((g, staged)) = &self.next {
            put(g, [NEXT_CA, NEXT_CRT, NEXT_KEY, NEXT_NOT_AFTER, NEXT_HOSTS]);
            annotations.insert(NEXT_STAGED_AT.into(), staged.to_string());
            if let Some(t) = self.next_trusted {
                annotations.insert(NEXT_TRUSTED_AT.into(), t.to_string());
            }
        }
        if let Some(ca) = &self.previous_ca {
            data.insert(PREVIOUS_CA.into(), ca.clone().into_bytes());
        }
        data.insert(CA_BUNDLE.into(), self.bundle().into_bytes());
        (data, annotations)
    }

    /// The CAs to trust: the previous one, the current one, the staged one.
    pub fn bundle(&self) -> String {
        let mut out = String::new();
        for ca in [
            self.previous_ca.as_ref(),
            self.current.as_ref().map(|g| &g.ca),
            self.next.as_ref().map(|(g, _)| &g.ca),
        ]
        .into_iter()
        .flatten()
        {
            out.push_str(ca.trim_end());
            out.push('\n');
        }
        out
    }
}

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
}

/// The step for what is stored, the hosts wanted and the time; `trusted(ca)` says whether the
/// webhook configuration's caBundles hold `ca`.
pub fn plan(
    stored: &Stored,
    hosts: &[String],
    now: Timestamp,
    t: Timing,
    trusted: impl Fn(&str) -> bool,
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
        Some((next, _)) => match (trusted(&next.ca), stored.next_trusted) {
            (false, None) => Step::AwaitTrust,
            (false, Some(_)) => Step::Untrusted,
            (true, None) => Step::MarkTrusted,
            (true, Some(since)) if now < since + t.grace => Step::Wait(since + t.grace),
            (true, Some(_)) => Step::Promote,
        },
        None if now >= renew_at || current.hosts != hosts => Step::Stage,
        None => Step::Wait(renew_at),
    }
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

/// A new generation for `hosts` (DNS names or IP addresses), valid from a little before `now`
/// for `validity`.
pub fn issue(
    hosts: &[String],
    now: Timestamp,
    validity: Duration,
) -> Result<Generation, rcgen::Error> {
    let not_before = to_time(now - BACKDATE);
    let not_after = now + validity;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(
        DnType::CommonName,
        format!("groundskeeper-webhook-ca-{}", now.as_second()),
    );
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = to_time(not_after);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(hosts.to_vec())?;
    leaf.distinguished_name.push(
        DnType::CommonName,
        hosts.first().cloned().unwrap_or_default(),
    );
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.not_before = not_before;
    leaf.not_after = to_time(not_after);
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok(Generation {
        ca: ca_cert.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
        // What the annotation can hold: whole seconds.
        not_after: Timestamp::from_second(not_after.as_second()).unwrap_or(not_after),
        hosts: hosts.to_vec(),
    })
}

fn to_time(t: Timestamp) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t.as_second())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A fake generation: `name` stands for its CA, certificate and key.
    fn fake(name: &str, not_after: Timestamp) -> Generation {
        Generation {
            ca: format!("CA {name}"),
            cert: format!("CERT {name}"),
            key: format!("KEY {name}"),
            not_after,
            hosts: hosts(),
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
            assert_eq!(plan(&stored, &hosts, now, T, |_| trusted), want, "{name}");
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
            let step = plan(&stored, &hosts(), now, T, |ca| bundle_seen.contains(ca));
            if step == Step::Promote {
                let (next, _) = stored.next.as_ref().unwrap();
                let since = held_since.get(&next.ca).copied();
                assert!(
                    since.is_some_and(|s| now.duration_since(s)
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
            plan(&Stored::read(&data, &broken), &hosts(), at(1), T, |_| true),
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
}
