//! The kubelet a node runs: its reported version, and the sysctl rules of each kubelet minor
//! version groundskeeper knows (v1.33 to v1.37).
//!
//! In a cluster being upgraded, nodes run different kubelets and each admits pods by its own
//! rules: the safe list (v1.37 adds two sysctls) and the namespace table (v1.37 knows `UTS` and
//! `User`). A node says which kubelet it runs in `status.nodeInfo.kubeletVersion`.

use std::{fmt, str::FromStr};

use super::allowlist::{Allowlist, Entry, PatternError, check_pattern_in};
use super::kernel::KernelVersion;
use super::names::{Namespace, NamespaceTable, go_quote, namespace_in};
use super::safe::{SAFE_SYSCTLS, SAFE_SYSCTLS_V1_37, SafeSysctl, dropped_of, safe_sysctls_of};

/// The oldest and newest minor versions whose rules are known.
pub const OLDEST_MINOR: u64 = 33;
pub const NEWEST_MINOR: u64 = 37;
/// The rules of a node that does not say which kubelet it runs, or says it unreadably.
pub const DEFAULT_MINOR: u64 = 36;

/// A reported version is quoted in messages up to this many characters.
const QUOTE_MAX: usize = 64;

/// The rules of one known kubelet minor version (1.33 to 1.37).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kubelet {
    minor: u64,
}

impl Default for Kubelet {
    fn default() -> Self {
        Kubelet::DEFAULT
    }
}

impl fmt::Display for Kubelet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v1.{}", self.minor)
    }
}

impl Kubelet {
    pub const OLDEST: Kubelet = Kubelet {
        minor: OLDEST_MINOR,
    };
    pub const NEWEST: Kubelet = Kubelet {
        minor: NEWEST_MINOR,
    };
    pub const DEFAULT: Kubelet = Kubelet {
        minor: DEFAULT_MINOR,
    };

    /// The rules of v1.`minor`, or None when they are not known.
    pub fn known(minor: u64) -> Option<Kubelet> {
        (OLDEST_MINOR..=NEWEST_MINOR)
            .contains(&minor)
            .then_some(Kubelet { minor })
    }

    /// Every known version, oldest first.
    pub fn all() -> impl Iterator<Item = Kubelet> {
        (OLDEST_MINOR..=NEWEST_MINOR).map(|minor| Kubelet { minor })
    }

    pub fn minor(self) -> u64 {
        self.minor
    }

    /// The rules for a node reporting `reported` as its kubelet version: that version's when
    /// known; the newest known for a newer one, the oldest for an older one; v1.36 (the
    /// default) when nothing, or nothing readable, is reported. Never fails.
    pub fn judge(reported: Option<&str>) -> Judged {
        let reported = reported.filter(|r| !r.trim().is_empty());
        let Some(raw) = reported else {
            return Judged {
                kubelet: Kubelet::DEFAULT,
                assumed: Some(format!(
                    "kubelet version not reported: judged as {}",
                    Kubelet::DEFAULT
                )),
            };
        };
        let version = match raw.parse::<KubeletVersion>() {
            Ok(v) => v,
            Err(e) => {
                return Judged {
                    kubelet: Kubelet::DEFAULT,
                    assumed: Some(format!("{e}: judged as {}", Kubelet::DEFAULT)),
                };
            }
        };
        let (major, minor) = (version.major, version.minor);
        if major == 1
            && let Some(kubelet) = Kubelet::known(minor)
        {
            return Judged {
                kubelet,
                assumed: None,
            };
        }
        let (kubelet, relation) = if (major, minor) > (1, NEWEST_MINOR) {
            (Kubelet::NEWEST, "newer than the newest")
        } else {
            (Kubelet::OLDEST, "older than the oldest")
        };
        Judged {
            kubelet,
            assumed: Some(format!(
                "kubelet {} is {relation} groundskeeper knows the sysctl rules of: judged as \
                 {kubelet}",
                quoted(raw)
            )),
        }
    }

    /// The namespace table this kubelet classifies sysctls by.
    pub fn namespaces(self) -> NamespaceTable {
        if self.minor >= 37 {
            NamespaceTable::IpcNetUtsUser
        } else {
            NamespaceTable::IpcNet
        }
    }

    /// This kubelet's safe list, with the kernel gates, in upstream order.
    pub fn safe_list(self) -> &'static [SafeSysctl] {
        if self.minor >= 37 {
            &SAFE_SYSCTLS_V1_37
        } else {
            &SAFE_SYSCTLS
        }
    }

    /// The safe sysctls this kubelet allows on `kernel` (None: unknown, only ungated ones).
    pub fn safe_sysctls(self, kernel: Option<&KernelVersion>) -> Vec<&'static str> {
        safe_sysctls_of(self.safe_list(), kernel)
    }

    /// The safe sysctls this kubelet drops on `kernel`, each with the reason.
    pub fn dropped(self, kernel: Option<&KernelVersion>) -> Vec<(&'static str, String)> {
        dropped_of(self.safe_list(), kernel)
    }

    pub fn namespace_of(self, name: &str) -> Namespace {
        namespace_in(self.namespaces(), name)
    }

    /// A pattern as this kubelet's `NewAllowlist` takes it.
    pub fn check_pattern(self, pattern: &str) -> Result<Entry, PatternError> {
        check_pattern_in(self.namespaces(), pattern)
    }

    /// `NewAllowlist` of this kubelet.
    pub fn allowlist<S: AsRef<str>>(self, patterns: &[S]) -> Result<Allowlist, PatternError> {
        Allowlist::new_in(self.namespaces(), patterns)
    }
}

/// The rules a node is judged by, and why they are not its reported version's, if they are not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judged {
    pub kubelet: Kubelet,
    /// Set when the node's own version's rules could not be used: not reported, unreadable,
    /// or outside the known range. Meant for logs and messages.
    pub assumed: Option<String>,
}

/// A kubelet's `gitVersion` as a node reports it: `v1.37.0`, `v1.36.2-eks-4d1a2b`,
/// `v1.33.1+k3s1`, `1.35`. Only the major and minor decide the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeletVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: Option<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "kubelet version {0} could not be parsed: expected v<major>.<minor>[.<patch>] with an \
     optional -suffix or +suffix, like v1.37.0 or v1.36.2-eks-4d1a2b"
)]
pub struct ParseKubeletVersionError(String);

impl FromStr for KubeletVersion {
    type Err = ParseKubeletVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseKubeletVersionError(quoted(s));
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        // The numeric part ends at the first `-` or `+` (pre-release, build, vendor suffix).
        let (numbers, suffix) = match t.find(['-', '+']) {
            Some(i) => (&t[..i], &t[i + 1..]),
            None => (t, ""),
        };
        if suffix.chars().any(char::is_control) {
            return Err(err());
        }
        let mut parts = numbers.split('.');
        let mut number = |required: bool| -> Result<Option<u64>, ParseKubeletVersionError> {
            match parts.next() {
                None if !required => Ok(None),
                Some(p)
                    if !p.is_empty() && p.len() <= 20 && p.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    p.parse().map(Some).map_err(|_| err())
                }
                _ => Err(err()),
            }
        };
        let major = number(true)?.ok_or_else(err)?;
        let minor = number(true)?.ok_or_else(err)?;
        let patch = number(false)?;
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(KubeletVersion {
            major,
            minor,
            patch,
        })
    }
}

/// `s` quoted for a message, cut to [`QUOTE_MAX`] characters.
fn quoted(s: &str) -> String {
    if s.chars().count() <= QUOTE_MAX {
        go_quote(s)
    } else {
        let cut: String = s.chars().take(QUOTE_MAX).collect();
        format!("{}…", go_quote(&cut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_versions_parse() {
        for (s, want) in [
            ("v1.37.0", (1, 37, Some(0))),
            ("v1.36.2-eks-4d1a2b", (1, 36, Some(2))),
            ("v1.33.1+k3s1", (1, 33, Some(1))),
            ("v1.37.0-alpha.1.23+abcdef", (1, 37, Some(0))),
            ("1.35", (1, 35, None)),
            ("  v1.34.3  ", (1, 34, Some(3))),
            ("v1.40.1", (1, 40, Some(1))),
            ("v2.0.0", (2, 0, Some(0))),
        ] {
            let v: KubeletVersion = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!((v.major, v.minor, v.patch), want, "{s}");
        }
    }

    #[test]
    fn garbage_is_an_error_naming_the_input() {
        let long = "v1.".repeat(1000);
        for bad in [
            "",
            "v",
            "1",
            "v1",
            "v1.",
            "v1.x",
            "x1.36",
            "vv1.36",
            "v1.36.2.1",
            "v1..36",
            "v1.36.",
            "v-1.36",
            "v1.99999999999999999999999",
            "v1.36-\u{1b}[31m",
            "kubelet",
            &long,
        ] {
            let e = bad.parse::<KubeletVersion>().unwrap_err().to_string();
            assert!(e.starts_with("kubelet version \""), "{bad:?}: {e}");
            assert!(e.len() < 400, "{bad:?}: message is bounded: {e}");
        }
    }

    #[test]
    fn judged_by_own_version_else_the_nearest_else_the_default() {
        let judge = |r: Option<&str>| Kubelet::judge(r);
        for minor in OLDEST_MINOR..=NEWEST_MINOR {
            let j = judge(Some(&format!("v1.{minor}.3-gke.100")));
            assert_eq!((j.kubelet.minor(), j.assumed), (minor, None), "{minor}");
        }
        for (reported, want, says) in [
            (None, DEFAULT_MINOR, "not reported: judged as v1.36"),
            (Some(""), DEFAULT_MINOR, "not reported"),
            (
                Some("garbage"),
                DEFAULT_MINOR,
                r#""garbage" could not be parsed"#,
            ),
            (Some("v1.40.0"), NEWEST_MINOR, "newer than the newest"),
            (Some("v2.1.0"), NEWEST_MINOR, "judged as v1.37"),
            (Some("v1.32.9"), OLDEST_MINOR, "older than the oldest"),
            (Some("v0.99.0"), OLDEST_MINOR, "judged as v1.33"),
        ] {
            let j = judge(reported);
            assert_eq!(j.kubelet.minor(), want, "{reported:?}");
            let note = j.assumed.unwrap_or_default();
            assert!(note.contains(says), "{reported:?}: {note}");
        }
    }

    #[test]
    fn rules_change_at_1_37_only() {
        for k in Kubelet::all() {
            let new = k.minor() >= 37;
            assert_eq!(k.safe_list().len(), if new { 14 } else { 12 }, "{k}");
            assert_eq!(
                k.namespace_of("kernel.domainname") == Namespace::Uts,
                new,
                "{k}"
            );
            assert_eq!(k.check_pattern("user.*").is_ok(), new, "{k}");
        }
        assert_eq!(Kubelet::default(), Kubelet::known(36).unwrap());
        assert_eq!(Kubelet::known(32), None);
        assert_eq!(Kubelet::known(38), None);
        assert_eq!(Kubelet::NEWEST.to_string(), "v1.37");
    }
}
