//! Where a server's certificate comes from: files (`--*-tls-cert-file`, `--*-tls-private-key-file`,
//! re-read when they change, as cert-manager or a mounted Secret renews them), or a self-signed
//! certificate of the process's own, made in memory at start and again before it runs out (as
//! kube-controller-manager's `--secure-port` does without `--tls-cert-file`).

use std::{path::PathBuf, sync::Arc, time::Duration};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
use tokio_util::sync::CancellationToken;

use super::Certificates;

/// How long a self-signed certificate is valid, and how long before its end it is replaced.
const VALIDITY: Duration = Duration::from_secs(365 * 86_400);
const RENEW_BEFORE: Duration = Duration::from_secs(30 * 86_400);
/// Valid from this long before it is made, for clocks a little behind.
const BACKDATE: Duration = Duration::from_secs(3600);
/// How often the files are read again (and a self-signed certificate's end looked at).
const RECHECK: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Made in memory for these names (DNS names or IP addresses).
    SelfSigned { hosts: Vec<String> },
    /// PEM files: a certificate chain and its private key.
    Files { cert: PathBuf, key: PathBuf },
}

/// The certificate and key (PEM) of a new self-signed certificate for `hosts`, valid from a
/// little before `now` for `VALIDITY`.
pub fn issue(hosts: &[String], now: time::OffsetDateTime) -> Result<(String, String), String> {
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(hosts.to_vec()).map_err(|e| e.to_string())?;
    params.distinguished_name.push(
        DnType::CommonName,
        hosts.first().cloned().unwrap_or_default(),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.not_before = now - BACKDATE;
    params.not_after = now + VALIDITY;
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Loads the certificate `source` gives into `certs`; an error says what is wrong with it.
pub fn load(source: &Source, certs: &Certificates) -> Result<bool, String> {
    match source {
        Source::SelfSigned { hosts } => {
            let (cert, key) = issue(hosts, time::OffsetDateTime::now_utc())?;
            certs.load(cert.as_bytes(), key.as_bytes())
        }
        Source::Files { cert, key } => {
            let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
            certs.load(&read(cert)?, &read(key)?)
        }
    }
}

/// Keeps `certs` current until `token` is cancelled: files read again every `RECHECK` (a
/// pair that does not load is logged and the old one kept); a self-signed certificate made
/// again `RENEW_BEFORE` its end.
pub async fn keep_current(
    name: &'static str,
    source: Source,
    certs: Arc<Certificates>,
    token: CancellationToken,
) {
    let mut issued = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(RECHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        if matches!(source, Source::SelfSigned { .. }) && issued.elapsed() < VALIDITY - RENEW_BEFORE
        {
            continue;
        }
        match load(&source, &certs) {
            Ok(true) => {
                issued = tokio::time::Instant::now();
                tracing::info!("{name}: serving a new certificate");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "{name}: the certificate could not be loaded; serving the one before")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_loads_and_names_its_hosts() {
        let certs = Certificates::default();
        let hosts = vec!["agent-1".to_string(), "127.0.0.1".to_string()];
        assert!(load(&Source::SelfSigned { hosts }, &certs).unwrap());
        assert!(certs.is_loaded());
    }

    #[test]
    fn files_that_are_missing_or_do_not_match_are_refused_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("gk-selfsigned-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let certs = Certificates::default();
        let files = Source::Files {
            cert: cert.clone(),
            key: key.clone(),
        };
        let e = load(&files, &certs).unwrap_err();
        assert!(e.contains("tls.crt"), "{e}");

        let now = time::OffsetDateTime::now_utc();
        let (c1, _) = issue(&["a".into()], now).unwrap();
        let (_, k2) = issue(&["b".into()], now).unwrap();
        std::fs::write(&cert, &c1).unwrap();
        std::fs::write(&key, &k2).unwrap();
        assert!(
            load(&files, &certs).is_err(),
            "a key of another certificate"
        );
        assert!(!certs.is_loaded());

        let (c, k) = issue(&["a".into()], now).unwrap();
        std::fs::write(&cert, &c).unwrap();
        std::fs::write(&key, &k).unwrap();
        assert!(load(&files, &certs).unwrap());
        assert!(
            !load(&files, &certs).unwrap(),
            "unchanged files: nothing swapped"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
