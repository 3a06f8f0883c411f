//! The running kernel's version.
//!
//! Parsed like `k8s.io/apimachinery/pkg/util/version.ParseGeneric`: leading numeric components
//! (at least two, the first without a leading zero), anything after them ignored, so distro
//! release strings parse.

use std::{cmp::Ordering, fmt, str::FromStr};

/// Where the kernel reports its release.
pub const OSRELEASE_PATH: &str = "/proc/sys/kernel/osrelease";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelVersion {
    components: Vec<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "could not parse {0:?} as a kernel version: expected at least two dot-separated numbers \
     like 5.15 or 6.1.0-18-amd64"
)]
pub struct ParseKernelVersionError(pub String);

impl KernelVersion {
    pub fn new(components: &[u64]) -> Self {
        Self {
            components: components.to_vec(),
        }
    }

    /// Component-wise comparison with missing components taken as 0 (`4.15 >= 4.15.0`).
    pub fn at_least(&self, min: &KernelVersion) -> bool {
        self.compare(min) != Ordering::Less
    }

    fn compare(&self, other: &KernelVersion) -> Ordering {
        let n = self.components.len().max(other.components.len());
        (0..n)
            .map(|i| {
                let a = self.components.get(i).copied().unwrap_or(0);
                let b = other.components.get(i).copied().unwrap_or(0);
                a.cmp(&b)
            })
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }

    /// Reads and parses `/proc/sys/kernel/osrelease`.
    pub fn from_host() -> Result<Self, String> {
        let raw = std::fs::read_to_string(OSRELEASE_PATH)
            .map_err(|e| format!("reading {OSRELEASE_PATH}: {e}"))?;
        raw.trim()
            .parse()
            .map_err(|e: ParseKernelVersionError| e.to_string())
    }
}

impl FromStr for KernelVersion {
    type Err = ParseKernelVersionError;

    /// `^\s*v?([0-9]+(?:\.[0-9]+)*)(.*)*$`, then at least two components, no leading zero on
    /// the first.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseKernelVersionError(s.to_string());
        let rest = s.trim_start();
        let rest = rest.strip_prefix('v').unwrap_or(rest);
        let mut components = Vec::new();
        let mut remaining = rest;
        loop {
            let digits = remaining
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(remaining.len());
            if digits == 0 {
                break;
            }
            let part = &remaining[..digits];
            if components.is_empty() && part.len() > 1 && part.starts_with('0') {
                return Err(err());
            }
            components.push(part.parse::<u64>().map_err(|_| err())?);
            remaining = &remaining[digits..];
            // A dot continues the version only when a digit follows it.
            match remaining.strip_prefix('.') {
                Some(next) if next.starts_with(|c: char| c.is_ascii_digit()) => remaining = next,
                _ => break,
            }
        }
        // Go's `.` in the trailing `(.*)*` does not match a newline, and `$` is end of text.
        if components.len() < 2 || remaining.contains('\n') {
            return Err(err());
        }
        Ok(Self { components })
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.components.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> KernelVersion {
        s.parse().unwrap()
    }

    #[test]
    fn distro_release_strings_parse() {
        for (input, want) in [
            ("6.1.0-18-amd64", vec![6, 1, 0]),
            ("5.14.0-427.el9.x86_64", vec![5, 14, 0]),
            ("3.18.0-957.27.2.el7.x86_64", vec![3, 18, 0]),
            ("5.15.0-75-generic", vec![5, 15, 0]),
            ("5.4.0", vec![5, 4, 0]),
            ("4.15", vec![4, 15]),
            ("  v6.8.0", vec![6, 8, 0]),
            ("6.6.87.2-microsoft-standard-WSL2", vec![6, 6, 87, 2]),
            ("4.19.0+", vec![4, 19, 0]),
            ("5.10.", vec![5, 10]),
            ("1.02", vec![1, 2]),
        ] {
            assert_eq!(v(input), KernelVersion::new(&want), "{input}");
        }
    }

    #[test]
    fn malformed_versions_are_errors_naming_the_input() {
        for bad in [
            "",
            "5",
            "6-amd64",
            "x5.4",
            "05.4",
            "vv5.4",
            "linux 5.4",
            ".5.4",
            "6.8.0\n",
        ] {
            let e = bad.parse::<KernelVersion>().unwrap_err();
            assert_eq!(e, ParseKernelVersionError(bad.into()), "{bad}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{bad}");
        }
    }

    #[test]
    fn comparison_is_componentwise_with_missing_as_zero() {
        assert!(v("4.15").at_least(&v("4.15")));
        assert!(v("4.15.0").at_least(&v("4.15")));
        assert!(v("4.15").at_least(&v("4.15.0")));
        assert!(!v("4.14.300").at_least(&v("4.15")));
        assert!(v("4.16").at_least(&v("4.15")));
        assert!(v("10.0").at_least(&v("9.99")));
        assert!(!v("3.15.99").at_least(&v("3.16")));
        assert!(v("5.4.0").at_least(&v("4.6")));
    }
}
