//! A certificate generation (a fresh CA and the one serving certificate it signed) and what
//! the webhook's Secret holds of generations: the keys and annotations read and written, the
//! caBundle, and how a generation is issued.

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
const TLS_NOT_BEFORE: &str = "groundskeeper.dev/tls-not-before";
const NEXT_NOT_BEFORE: &str = "groundskeeper.dev/next-not-before";
const TLS_HOSTS: &str = "groundskeeper.dev/tls-hosts";
const NEXT_NOT_AFTER: &str = "groundskeeper.dev/next-not-after";
const NEXT_HOSTS: &str = "groundskeeper.dev/next-hosts";
const NEXT_STAGED_AT: &str = "groundskeeper.dev/next-staged-at";
const NEXT_TRUSTED_AT: &str = "groundskeeper.dev/next-trusted-at";

/// Certificates are valid from this long before they are issued: the most the apiserver's clock
/// (which judges the certificate when it calls the webhook) may be behind the clock of the
/// replica that issued it. An hour, as client-go's self-signed certificates: far beyond what
/// NTP-synchronised machines drift, and a replica further ahead than that does not serve a
/// staged certificate early anyway (`rotation::plan` promotes only what is valid by the
/// apiserver's clock).
pub const BACKDATE: Duration = Duration::from_secs(3600);

/// One CA and the serving certificate it signed, PEM.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub ca: String,
    pub cert: String,
    pub key: String,
    /// Valid from (whole seconds); `None` in a Secret written without it.
    pub not_before: Option<Timestamp>,
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

/// Where the served generation and the staged one are kept: CA, certificate, key (data),
/// valid from, valid until, hosts (annotations).
const CURRENT: [&str; 6] = [
    TLS_CA,
    TLS_CRT,
    TLS_KEY,
    TLS_NOT_BEFORE,
    TLS_NOT_AFTER,
    TLS_HOSTS,
];
const NEXT: [&str; 6] = [
    NEXT_CA,
    NEXT_CRT,
    NEXT_KEY,
    NEXT_NOT_BEFORE,
    NEXT_NOT_AFTER,
    NEXT_HOSTS,
];

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
        let generation = |[ca, cert, key, not_before, not_after, h]: [&str; 6]| {
            Some(Generation {
                ca: text(ca)?,
                cert: text(cert)?,
                key: text(key)?,
                not_before: time(not_before),
                not_after: time(not_after)?,
                hosts: hosts(h).unwrap_or_default(),
            })
        };
        Stored {
            current: generation(CURRENT),
            next: generation(NEXT).zip(time(NEXT_STAGED_AT)),
            next_trusted: time(NEXT_TRUSTED_AT),
            previous_ca: text(PREVIOUS_CA),
        }
    }

    /// The Secret's data and annotations for what is stored.
    pub fn write(&self) -> (Data, Annotations) {
        let mut data = Data::new();
        let mut annotations = Annotations::new();
        let mut put = |g: &Generation, [ca, cert, key, not_before, not_after, hosts]: [&str; 6]| {
            data.insert(ca.into(), g.ca.clone().into_bytes());
            data.insert(cert.into(), g.cert.clone().into_bytes());
            data.insert(key.into(), g.key.clone().into_bytes());
            if let Some(t) = g.not_before {
                annotations.insert(not_before.into(), t.to_string());
            }
            annotations.insert(not_after.into(), g.not_after.to_string());
            annotations.insert(hosts.into(), g.hosts.join(","));
        };
        if let Some(g) = &self.current {
            put(g, CURRENT);
        }
        if let Some((g, staged)) = &self.next {
            put(g, NEXT);
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

/// A new generation for `hosts` (DNS names or IP addresses), valid from a little before `now`
/// for `validity`.
pub fn issue(
    hosts: &[String],
    now: Timestamp,
    validity: Duration,
) -> Result<Generation, rcgen::Error> {
    // Whole seconds, as the certificate holds it (and the annotation records it).
    let valid_from = Timestamp::from_second((now - BACKDATE).as_second()).unwrap_or(now - BACKDATE);
    let not_before = to_time(valid_from);
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
        not_before: Some(valid_from),
        // What the annotation can hold: whole seconds.
        not_after: Timestamp::from_second(not_after.as_second()).unwrap_or(not_after),
        hosts: hosts.to_vec(),
    })
}

fn to_time(t: Timestamp) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t.as_second())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}
