//! The kubelet a node runs: its reported version, and the sysctl rules of each kubelet minor
//! version groundskeeper knows (v1.33 to v1.38).
//!
//! In a cluster being upgraded, nodes run different kubelets and each admits pods by its own
//! rules: the safe list (v1.37 adds two sysctls) and the namespace table (v1.37 knows `UTS` and
//! `User`); v1.38 keeps v1.37's. A node says which kubelet it runs in
//! `status.nodeInfo.kubeletVersion`.

use std::{fmt, str::FromStr};

use super::allowlist::{Allowlist, Entry, PatternError, check_pattern_in};
use super::kernel::KernelVersion;
use super::names::{Namespace, NamespaceTable, go_quote, namespace_in};
use super::safe::{SAFE_SYSCTLS, SAFE_SYSCTLS_V1_37, SafeSysctl, dropped_of, safe_sysctls_of};

/// The oldest and newest minor versions whose rules are known.
pub const OLDEST_MINOR: u64 = 33;
pub const NEWEST_MINOR: u64 = 38;
/// The rules of a node that does not say which kubelet it runs, or says it unreadably.
pub const DEFAULT_MINOR: u64 = 36;

/// A reported version is quoted in messages up to this many characters.
const QUOTE_MAX: usize = 64;

/// Each known minor version's safe list and namespace table, oldest first, one row per minor
/// from [`OLDEST_MINOR`] to [`NEWEST_MINOR`] (checked below, at compile time). Where each row
/// comes from is in docs/sysctl.md, "Kubelet versions".
const RULES: [(u64, &[SafeSysctl], NamespaceTable); 6] = [
    (33, &SAFE_SYSCTLS, NamespaceTable::IpcNet),
    (34, &SAFE_SYSCTLS, NamespaceTable::IpcNet),
    (35, &SAFE_SYSCTLS, NamespaceTable::IpcNet),
    (36, &SAFE_SYSCTLS, NamespaceTable::IpcNet),
    (37, &SAFE_SYSCTLS_V1_37, NamespaceTable::IpcNetUtsUser),
    (38, &SAFE_SYSCTLS_V1_37, NamespaceTable::IpcNetUtsUser),
];

const _: () = {
    assert!(RULES.len() as u64 == NEWEST_MINOR - OLDEST_MINOR + 1);
    let mut i = 0;
    while i < RULES.len() {
        assert!(RULES[i].0 == OLDEST_MINOR + i as u64);
        i += 1;
    }
};

/// The rules of one known kubelet minor version (1.33 to 1.38).
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
    pub fn from_reported(reported: Option<&str>) -> ReportedKubelet {
        let reported = reported.filter(|r| !r.trim().is_empty());
        let Some(raw) = reported else {
            return ReportedKubelet {
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
                return ReportedKubelet {
                    kubelet: Kubelet::DEFAULT,
                    assumed: Some(format!("{e}: judged as {}", Kubelet::DEFAULT)),
                };
            }
        };
        let (major, minor) = (version.major, version.minor);
        if major == 1
            && let Some(kubelet) = Kubelet::known(minor)
        {
            return ReportedKubelet {
                kubelet,
                assumed: None,
            };
        }
        let (kubelet, relation) = if (major, minor) > (1, NEWEST_MINOR) {
            (Kubelet::NEWEST, "newer than the newest")
        } else {
            (Kubelet::OLDEST, "older than the oldest")
        };
        ReportedKubelet {
            kubelet,
            assumed: Some(format!(
                "kubelet {} is {relation} groundskeeper knows the sysctl rules of: judged as \
                 {kubelet}",
                quoted(raw)
            )),
        }
    }

    /// This kubelet's row of [`RULES`]; `minor` is known, as every constructor ensures.
    fn rules(self) -> (u64, &'static [SafeSysctl], NamespaceTable) {
        RULES[(self.minor - OLDEST_MINOR) as usize]
    }

    /// The namespace table this kubelet classifies sysctls by.
    pub fn namespaces(self) -> NamespaceTable {
        self.rules().2
    }

    /// This kubelet's safe list, with the kernel gates, in upstream order.
    pub fn safe_list(self) -> &'static [SafeSysctl] {
        self.rules().1
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
pub struct ReportedKubelet {
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
pub(crate) fn quoted(s: &str) -> String {
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
        let from_reported = |r: Option<&str>| Kubelet::from_reported(r);
        for minor in OLDEST_MINOR..=NEWEST_MINOR {
            let j = from_reported(Some(&format!("v1.{minor}.3-gke.100")));
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
            (Some("v1.39.0"), NEWEST_MINOR, "newer than the newest"),
            (Some("v1.40.0"), NEWEST_MINOR, "newer than the newest"),
            (Some("v2.1.0"), NEWEST_MINOR, "judged as v1.38"),
            (Some("v1.32.9"), OLDEST_MINOR, "older than the oldest"),
            (Some("v0.99.0"), OLDEST_MINOR, "judged as v1.33"),
        ] {
            let j = from_reported(reported);
            assert_eq!(j.kubelet.minor(), want, "{reported:?}");
            let note = j.assumed.unwrap_or_default();
            assert!(note.contains(says), "{reported:?}: {note}");
        }
    }

    /// v1.38 in every form a node reports it (releases, pre-releases, vendor builds) is a known
    /// version, judged by its own rules with nothing assumed.
    #[test]
    fn v1_38_in_every_form_is_known() {
        for reported in [
            "v1.38.0",
            "v1.38.2",
            "v1.38.0-alpha.2",
            "v1.38.0-alpha.1.15+0123abcd",
            "v1.38.1-eks-4d1a2b",
            "1.38",
        ] {
            let j = Kubelet::from_reported(Some(reported));
            assert_eq!((j.kubelet.minor(), j.assumed), (38, None), "{reported}");
        }
    }

    /// Probe names for the namespace tables: every table entry, its neighbours, and generated
    /// dotted names over the tables' first segments.
    fn probe_names() -> Vec<String> {
        let mut names: Vec<String> = Kubelet::NEWEST
            .safe_list()
            .iter()
            .map(|s| s.name.to_string())
            .collect();
        let firsts = ["kernel", "net", "fs", "user", "users", "vm", "ipc"];
        let seconds = [
            "",
            "shm",
            "shmmax",
            "msg",
            "msgmax",
            "sem",
            "domainname",
            "hostname",
        ];
        let thirds = ["", "mqueue", "ipv4", "core", "max_user_namespaces", "x"];
        for a in firsts {
            for b in seconds {
                for c in thirds {
                    let parts: Vec<&str> =
                        [a, b, c].into_iter().filter(|p| !p.is_empty()).collect();
                    names.push(parts.join("."));
                    names.push(format!("{}.", parts.join(".")));
                    names.push(format!("{}*", parts.join(".")));
                }
            }
        }
        names
    }

    /// The rules only grow: from each known minor to the next, every safe sysctl stays safe with
    /// its kernel gate, every name the older table namespaces keeps its namespace, and every
    /// pattern the older kubelet takes the newer takes; so a node upgraded by one minor allows
    /// all it allowed, on any kernel.
    #[test]
    fn each_minor_keeps_the_previous_ones_rules() {
        let kernels: Vec<Option<KernelVersion>> = [
            None,
            Some("3.10.0"),
            Some("4.5"),
            Some("4.14.300"),
            Some("4.15"),
            Some("6.1.0-18-amd64"),
        ]
        .into_iter()
        .map(|k| k.map(|k| k.parse().unwrap()))
        .collect();
        let names = probe_names();
        let pairs: Vec<(Kubelet, Kubelet)> = Kubelet::all().zip(Kubelet::all().skip(1)).collect();
        assert_eq!(pairs.len() as u64, NEWEST_MINOR - OLDEST_MINOR);
        for (old, new) in pairs {
            assert_eq!(new.minor(), old.minor() + 1);
            for safe in old.safe_list() {
                assert!(
                    new.safe_list().contains(safe),
                    "{old} -> {new}: {safe:?} dropped"
                );
            }
            for kernel in &kernels {
                let now = new.safe_sysctls(kernel.as_ref());
                for name in old.safe_sysctls(kernel.as_ref()) {
                    assert!(
                        now.contains(&name),
                        "{old} -> {new}, kernel {kernel:?}: {name}"
                    );
                }
            }
            for name in &names {
                let was = old.namespace_of(name);
                if was != Namespace::Unknown {
                    assert_eq!(new.namespace_of(name), was, "{old} -> {new}: {name}");
                }
                if old.check_pattern(name).is_ok() {
                    assert!(new.check_pattern(name).is_ok(), "{old} -> {new}: {name}");
                }
            }
        }
    }

    /// Kubelet v1.38 judges by v1.37's rules: the same safe list in the same order, the same
    /// namespace table, and so the same namespace and pattern verdict for every probe name.
    #[test]
    fn v1_38_has_v1_37s_rules() {
        let (v37, v38) = (Kubelet::known(37).unwrap(), Kubelet::known(38).unwrap());
        assert_eq!(v38.safe_list(), v37.safe_list());
        assert_eq!(v38.namespaces(), v37.namespaces());
        for name in probe_names() {
            assert_eq!(v38.namespace_of(&name), v37.namespace_of(&name), "{name}");
            assert_eq!(v38.check_pattern(&name), v37.check_pattern(&name), "{name}");
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
        assert_eq!(Kubelet::known(39), None);
        assert_eq!(Kubelet::NEWEST.to_string(), "v1.38");
    }
}
