//! Sysctl names and patterns: normalisation, namespace classification, syntax.
//!
//! The apiserver's name/pattern syntax in hand-written equivalents of the upstream regexes; a
//! sysctl segment can not contain a separator, so splitting on `.`/`/` and checking each piece
//! is exact.

use std::fmt;

/// Longest valid sysctl name or pattern (`SysctlMaxLength`).
pub const MAX_LENGTH: usize = 253;

/// `SysctlContainSlashPatternFmt`, quoted verbatim in pattern errors as upstream does.
pub const PATTERN_REGEX: &str =
    r"([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]";

/// `SysctlContainSlashFmt`, anchored as the apiserver compiles it.
pub const NAME_REGEX: &str =
    r"^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";

/// The same pattern syntax in RE2 (CEL `matches()`), anchored; `[./]` needs no escape.
pub const PATTERN_RE2: &str =
    "^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]$";

/// The kernel namespace that isolates a sysctl.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Namespace {
    Ipc,
    Net,
    /// `kernel.domainname`, known to kubelet from v1.37 on.
    Uts,
    /// `user.*`, known to kubelet from v1.37 on.
    User,
    Unknown,
}

impl fmt::Display for Namespace {
    /// The exact strings of the upstream messages (`host IPC`, `host Net`) and constants
    /// (`UTS`, `User`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Namespace::Ipc => "IPC",
            Namespace::Net => "Net",
            Namespace::Uts => "UTS",
            Namespace::User => "User",
            Namespace::Unknown => "",
        })
    }
}

/// Which namespace table a kubelet classifies by (`k8s.io/component-helpers`
/// `node/util/sysctl/namespace.go`): IPC and Net up to v1.36; v1.37 adds `UTS` for
/// `kernel.domainname` and `User` for `user.*`, and v1.38 keeps v1.37's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum NamespaceTable {
    #[default]
    IpcNet,
    IpcNetUtsUser,
}

impl NamespaceTable {
    /// The newest table: what any known kubelet accepts as namespaced.
    pub const NEWEST: NamespaceTable = NamespaceTable::IpcNetUtsUser;
}

/// Names classified exactly; `kernel.shm` and `kernel.msg` keep old `kernel.shm*`/`kernel.msg*`
/// patterns working.
const EXACT: [(&str, Namespace); 10] = [
    ("kernel.sem", Namespace::Ipc),
    ("kernel.shmall", Namespace::Ipc),
    ("kernel.shmmax", Namespace::Ipc),
    ("kernel.shmmni", Namespace::Ipc),
    ("kernel.shm_rmid_forced", Namespace::Ipc),
    ("kernel.shm", Namespace::Ipc),
    ("kernel.msgmax", Namespace::Ipc),
    ("kernel.msgmnb", Namespace::Ipc),
    ("kernel.msgmni", Namespace::Ipc),
    ("kernel.msg", Namespace::Ipc),
];

/// Prefixes, matched with a following `.`.
const PREFIXES: [(&str, Namespace); 2] = [("net", Namespace::Net), ("fs.mqueue", Namespace::Ipc)];

/// What [`NamespaceTable::IpcNetUtsUser`] adds: one exact name, one prefix.
const EXACT_UTS: (&str, Namespace) = ("kernel.domainname", Namespace::Uts);
const PREFIX_USER: (&str, Namespace) = ("user", Namespace::User);

/// `NormalizeName`: slash-separated names become dot-separated, but only when the FIRST
/// separator is `/`; then every `.` and `/` swap, so a dot in an interface name (`eno2.100`)
/// survives as `/`.
pub fn normalize(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

/// The namespace of a normalized name or prefix by kubelet v1.33 to v1.36's table.
pub fn namespace_of(name: &str) -> Namespace {
    namespace_in(NamespaceTable::IpcNet, name)
}

/// The namespace of a normalized name or prefix by `table`: exact names first, then prefixes.
pub fn namespace_in(table: NamespaceTable, name: &str) -> Namespace {
    let newer = table == NamespaceTable::IpcNetUtsUser;
    let exact = EXACT.iter().chain(newer.then_some(&EXACT_UTS));
    if let Some((_, ns)) = exact.into_iter().find(|(n, _)| *n == name) {
        return *ns;
    }
    PREFIXES
        .iter()
        .chain(newer.then_some(&PREFIX_USER))
        .find(|(p, _)| {
            name.strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('.'))
        })
        .map_or(Namespace::Unknown, |(_, ns)| *ns)
}

/// `GetNamespace`: the normalized name, cut at the first `*` for a pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified {
    pub namespace: Namespace,
    pub sysctl_or_prefix: String,
    pub prefixed: bool,
}

pub fn classify(pattern: &str) -> Classified {
    classify_in(NamespaceTable::IpcNet, pattern)
}

/// [`classify`] by `table`.
pub fn classify_in(table: NamespaceTable, pattern: &str) -> Classified {
    let mut s = normalize(pattern);
    let prefixed = match s.find('*') {
        Some(i) => {
            s.truncate(i);
            true
        }
        None => false,
    };
    Classified {
        namespace: namespace_in(table, &s),
        sysctl_or_prefix: s,
        prefixed,
    }
}

fn is_segment(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            alnum(f) && alnum(l) && b.iter().all(|&c| alnum(c) || c == b'-' || c == b'_')
        }
        _ => false,
    }
}

fn is_pattern_segment(s: &str) -> bool {
    match s.strip_suffix('*') {
        // `([a-z0-9][-_a-z0-9]*)?\*`: the optional head starts alphanumeric, may end in -/_.
        Some(head) => {
            head.is_empty()
                || (head.as_bytes()[0].is_ascii_lowercase() || head.as_bytes()[0].is_ascii_digit())
                    && head.bytes().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_'
                    })
        }
        None => is_segment(s),
    }
}

fn matches_syntax(s: &str, last: fn(&str) -> bool) -> bool {
    let pieces: Vec<&str> = s.split(['.', '/']).collect();
    let (tail, init) = pieces
        .split_last()
        .expect("split yields at least one piece");
    init.iter().all(|p| is_segment(p)) && last(tail)
}

/// `IsValidSysctlName`: at most 253 characters and `SysctlContainSlashFmt`.
pub fn is_valid_name(name: &str) -> bool {
    name.len() <= MAX_LENGTH && matches_syntax(name, is_segment)
}

/// `IsValidSysctlPattern`: at most 253 characters and `SysctlContainSlashPatternFmt` (a `*`
/// only as the last character).
pub fn is_valid_pattern(pattern: &str) -> bool {
    pattern.len() <= MAX_LENGTH && matches_syntax(pattern, is_pattern_segment)
}

/// Go's `%q` for the strings that reach messages: `"` and `\` escaped, control and
/// non-printable characters as escapes, printable Unicode kept.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => {
                if (c as u32) <= 0xffff {
                    out.push_str(&format!("\\u{:04x}", c as u32))
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32))
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_swaps_only_when_slash_comes_first() {
        for (input, want) in [
            ("", ""),
            ("kernel.shm_rmid_forced", "kernel.shm_rmid_forced"),
            ("kernel/shm_rmid_forced", "kernel.shm_rmid_forced"),
            (
                "net.ipv4.conf.eno2/100.rp_filter",
                "net.ipv4.conf.eno2/100.rp_filter",
            ),
            (
                "net/ipv4/conf/eno2.100/rp_filter",
                "net.ipv4.conf.eno2/100.rp_filter",
            ),
            ("foo", "foo"),
            ("/a.b", ".a/b"),
            ("kernel/msg*", "kernel.msg*"),
        ] {
            assert_eq!(normalize(input), want, "{input}");
        }
    }

    #[test]
    fn classification_exact_then_prefix() {
        use Namespace::*;
        for (input, ns, s, prefixed) in [
            ("net.ipv6.neigh.*", Net, "net.ipv6.neigh.", true),
            ("kernel.msg*", Ipc, "kernel.msg", true),
            ("kernel.shm*", Ipc, "kernel.shm", true),
            ("net.*", Net, "net.", true),
            ("net*", Unknown, "net", true),
            ("fs.mqueue.*", Ipc, "fs.mqueue.", true),
            ("*", Unknown, "", true),
            ("kernel/sem", Ipc, "kernel.sem", false),
            ("kernel.sem", Ipc, "kernel.sem", false),
            ("kernel.shmall", Ipc, "kernel.shmall", false),
            ("kernel.shmmax", Ipc, "kernel.shmmax", false),
            ("kernel.shmmni", Ipc, "kernel.shmmni", false),
            (
                "kernel.shm_rmid_forced",
                Ipc,
                "kernel.shm_rmid_forced",
                false,
            ),
            ("kernel.msgmax", Ipc, "kernel.msgmax", false),
            ("kernel.msgmnb", Ipc, "kernel.msgmnb", false),
            ("kernel.msgmni", Ipc, "kernel.msgmni", false),
            ("fs.mqueue.msg_max", Ipc, "fs.mqueue.msg_max", false),
            ("net.core.somaxconn", Net, "net.core.somaxconn", false),
            ("foo", Unknown, "foo", false),
            ("net", Unknown, "net", false),
            ("fs.mqueue", Unknown, "fs.mqueue", false),
            ("kernel.foo", Unknown, "kernel.foo", false),
            ("kernel.msgfoo", Unknown, "kernel.msgfoo", false),
            ("vm.swappiness", Unknown, "vm.swappiness", false),
            ("network.foo", Unknown, "network.foo", false),
            ("a.b*c*", Unknown, "a.b", true),
        ] {
            let got = classify(input);
            assert_eq!(
                got,
                Classified {
                    namespace: ns,
                    sysctl_or_prefix: s.into(),
                    prefixed
                },
                "{input}"
            );
        }
    }

    /// The v1.37 table adds exactly `kernel.domainname` (UTS) and `user.*` (User); every name
    /// the older table knows keeps its namespace.
    #[test]
    fn newer_table_adds_uts_and_user_only() {
        use Namespace::*;
        for (name, old, new) in [
            ("kernel.domainname", Unknown, Uts),
            ("kernel.domainname2", Unknown, Unknown),
            ("kernel.hostname", Unknown, Unknown),
            ("user.max_user_namespaces", Unknown, User),
            ("user.", Unknown, User),
            ("user", Unknown, Unknown),
            ("users.x", Unknown, Unknown),
            ("kernel.shm_rmid_forced", Ipc, Ipc),
            ("net.core.somaxconn", Net, Net),
            ("fs.mqueue.msg_max", Ipc, Ipc),
            ("vm.swappiness", Unknown, Unknown),
        ] {
            assert_eq!(namespace_in(NamespaceTable::IpcNet, name), old, "{name}");
            assert_eq!(namespace_of(name), old, "{name}");
            assert_eq!(namespace_in(NamespaceTable::NEWEST, name), new, "{name}");
        }
        assert_eq!(
            classify_in(NamespaceTable::NEWEST, "user/max_*").namespace,
            User
        );
        assert_eq!(classify("user.*").namespace, Unknown);
    }

    /// Each of `ok` passes `valid` and each of `bad` fails it; the one that does not is named.
    fn syntax(valid: fn(&str) -> bool, ok: &[&str], bad: &[&str]) {
        for s in ok {
            assert!(valid(s), "{s:?} should be valid");
        }
        for s in bad {
            assert!(!valid(s), "{s:?} should be invalid");
        }
    }

    #[test]
    fn name_syntax() {
        let long = format!("a.{}", "b".repeat(251));
        assert_eq!(long.len(), 253);
        let ok = [
            "a",
            "kernel.shm_rmid_forced",
            "net.ipv4.conf.eno2/100.rp_filter",
            "net/ipv4/conf/eno2.100/rp_filter",
            "a-b_c.d0",
            "0.9",
            &long,
        ];
        let too_long = format!("{long}c");
        let bad = [
            "",
            "Kernel.sem",
            "a.",
            ".a",
            "a..b",
            "a-.b",
            "a._b",
            "kernel.*",
            "a*",
            "a b",
            "ä",
            "a//b",
            &too_long,
        ];
        syntax(is_valid_name, &ok, &bad);
    }

    #[test]
    fn pattern_syntax() {
        let long = format!("a.{}*", "b".repeat(250));
        assert_eq!(long.len(), 253);
        let ok = [
            "*",
            "a*",
            "a-*",
            "a_*",
            "net.*",
            "kernel.msg*",
            "net/ipv4/*",
            "a.b",
            "a",
            "9",
            "kernel.shm_rmid_forced",
            &long,
        ];
        let too_long = format!("b{long}");
        let bad = [
            "", "**", "*a", "a*b", "a.*.b", "-a*", "_*", "a-", "a.b-.c*", "net.", "Net.*", "a..*",
            "a*.b", &too_long,
        ];
        syntax(is_valid_pattern, &ok, &bad);
    }

    #[test]
    fn go_quoting() {
        assert_eq!(go_quote("foo"), r#""foo""#);
        assert_eq!(go_quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(go_quote("a\nb\u{1}"), r#""a\nb\x01""#);
        assert_eq!(go_quote("ä"), "\"ä\"");
    }
}
