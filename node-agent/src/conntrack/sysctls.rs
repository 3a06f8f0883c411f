//! kube-proxy's conntrack sysctls, set only when their flag is given. The plan is pure; the
//! writes go under configurable roots so tests use a temp dir.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use groundskeeper_plumbing::client::parse_duration;

#[derive(Args, Debug, Clone, Default)]
pub struct ConntrackSysctlArgs {
    /// Conntrack entries to allow per CPU core: sets net.netfilter.nf_conntrack_max to
    /// max(this x cores, --conntrack-min). Unset: nf_conntrack_max is left alone.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_MAX_PER_CORE", value_parser = clap::value_parser!(u32).range(1..))]
    pub conntrack_max_per_core: Option<u32>,

    /// Floor for nf_conntrack_max when --conntrack-max-per-core is set (kube-proxy: 131072).
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_MIN", default_value_t = 131072)]
    pub conntrack_min: u32,

    /// Lets --conntrack-max-per-core lower an nf_conntrack_max that is already higher than the
    /// computed value (someone raised it on purpose; lowering it drops flows once full).
    /// false: a higher value is left alone.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_MAX_ALLOW_LOWER", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub conntrack_max_allow_lower: bool,

    /// Sets nf_conntrack_tcp_timeout_established (e.g. 24h). Unset: left alone.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_TCP_TIMEOUT_ESTABLISHED", value_parser = whole_seconds)]
    pub conntrack_tcp_timeout_established: Option<Duration>,

    /// Sets nf_conntrack_tcp_timeout_close_wait (e.g. 1h). Unset: left alone.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_TCP_TIMEOUT_CLOSE_WAIT", value_parser = whole_seconds)]
    pub conntrack_tcp_timeout_close_wait: Option<Duration>,

    /// Sets nf_conntrack_tcp_be_liberal=1 (accept out-of-window TCP packets instead of
    /// marking them INVALID). false: left alone.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_TCP_BE_LIBERAL", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub conntrack_tcp_be_liberal: bool,

    /// Sets nf_conntrack_udp_timeout (unanswered UDP flows, e.g. 30s). Unset: left alone.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_UDP_TIMEOUT", value_parser = whole_seconds)]
    pub conntrack_udp_timeout: Option<Duration>,

    /// Sets nf_conntrack_udp_timeout_stream (answered UDP flows, e.g. 2m). Unset: left alone.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_UDP_TIMEOUT_STREAM", value_parser = whole_seconds)]
    pub conntrack_udp_timeout_stream: Option<Duration>,
}

/// A duration the kernel can take: whole seconds, above zero.
fn whole_seconds(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() || d.subsec_nanos() != 0 {
        return Err(format!(
            "{s:?}: conntrack timeouts are whole seconds above 0"
        ));
    }
    Ok(d)
}

/// One file to write, relative to its root (`/proc/sys` or `/sys`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub path: &'static str,
    pub value: u64,
    /// Under /sys rather than /proc/sys.
    pub sysfs: bool,
}

pub const NF_CONNTRACK_MAX: &str = "net/netfilter/nf_conntrack_max";
pub const HASHSIZE: &str = "module/nf_conntrack/parameters/hashsize";

/// kube-proxy's `getConntrackMax`: per-core x cores, floored at the minimum.
pub fn conntrack_max(per_core: u32, min: u32, cores: usize) -> u64 {
    (u64::from(per_core) * cores as u64).max(u64::from(min))
}

/// What to write, given the current values (`None` = unreadable). Like kube-proxy, a value
/// already in place is not rewritten, and the hash table is grown to max/4 buckets only when
/// it has fewer (hashsize is writable only from the initial network namespace). Unlike
/// kube-proxy, an nf_conntrack_max already above the computed one is not lowered unless
/// --conntrack-max-allow-lower says so.
pub fn plan(
    args: &ConntrackSysctlArgs,
    cores: usize,
    current: impl Fn(&'static str, bool) -> Option<u64>,
) -> Vec<Write> {
    let mut out = Vec::new();
    let mut set = |path: &'static str, value: u64| {
        if current(path, false) != Some(value) {
            out.push(Write {
                path,
                value,
                sysfs: false,
            });
        }
    };
    let max = args
        .conntrack_max_per_core
        .map(|pc| conntrack_max(pc, args.conntrack_min, cores));
    if let Some(max) = max {
        let higher = current(NF_CONNTRACK_MAX, false).is_some_and(|cur| cur > max);
        if !higher || args.conntrack_max_allow_lower {
            set(NF_CONNTRACK_MAX, max);
        }
    }
    let timeouts = [
        (
            "net/netfilter/nf_conntrack_tcp_timeout_established",
            args.conntrack_tcp_timeout_established,
        ),
        (
            "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
            args.conntrack_tcp_timeout_close_wait,
        ),
        (
            "net/netfilter/nf_conntrack_udp_timeout",
            args.conntrack_udp_timeout,
        ),
        (
            "net/netfilter/nf_conntrack_udp_timeout_stream",
            args.conntrack_udp_timeout_stream,
        ),
    ];
    for (path, d) in timeouts {
        if let Some(d) = d {
            set(path, d.as_secs());
        }
    }
    if args.conntrack_tcp_be_liberal {
        set("net/netfilter/nf_conntrack_tcp_be_liberal", 1);
    }
    if let Some(max) = max
        && current(HASHSIZE, true).is_none_or(|h| h < max / 4)
    {
        out.push(Write {
            path: HASHSIZE,
            value: max / 4,
            sysfs: true,
        });
    }
    out
}

#[derive(Debug, thiserror::Error)]
#[error("writing {value} to {path}: {source}{hint}")]
pub struct SysctlError {
    pub path: PathBuf,
    pub value: u64,
    pub source: std::io::Error,
    hint: String,
}

/// Where the files live; tests point these at a temp dir.
#[derive(Debug, Clone)]
pub struct Roots {
    pub proc_sys: PathBuf,
    pub sys: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            proc_sys: "/proc/sys".into(),
            sys: "/sys".into(),
        }
    }
}

impl Roots {
    fn path(&self, path: &str, sysfs: bool) -> PathBuf {
        if sysfs {
            self.sys.join(path)
        } else {
            self.proc_sys.join(path)
        }
    }

    pub fn read(&self, path: &str, sysfs: bool) -> Option<u64> {
        std::fs::read_to_string(self.path(path, sysfs))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// Plans and writes; every write is tried, each failure returned (the caller logs them and
/// keeps running the cleanup).
pub fn apply(
    args: &ConntrackSysctlArgs,
    cores: usize,
    roots: &Roots,
) -> (Vec<Write>, Vec<SysctlError>) {
    let writes = plan(args, cores, |p, sysfs| roots.read(p, sysfs));
    let mut errors = Vec::new();
    let mut done = Vec::new();
    for w in writes {
        let path = roots.path(w.path, w.sysfs);
        match std::fs::write(&path, format!("{}\n", w.value)) {
            Ok(()) => done.push(w),
            Err(source) => {
                let hint = write_hint(
                    source.raw_os_error(),
                    std::fs::metadata(&path).ok().map(|m| {
                        use std::os::unix::fs::PermissionsExt;
                        m.permissions().mode()
                    }),
                    effective_caps(),
                );
                errors.push(SysctlError {
                    path,
                    value: w.value,
                    source,
                    hint,
                });
            }
        }
    }
    (done, errors)
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;

/// Why a write failed, from what was tried and what the process can see: the old hint blamed
/// privileges even in a privileged container, where the cause was the kernel's (a sysctl that
/// is read-only outside the host's network namespace).
fn write_hint(errno: Option<i32>, mode: Option<u32>, caps: Option<u64>) -> String {
    let has = |cap: u32| caps.map(|c| c & (1 << cap) != 0);
    match errno {
        Some(libc::EROFS) => " (this container's /proc/sys or /sys is mounted read-only: only a \
            privileged container gets them writable, as the chart's init container is)"
            .into(),
        Some(libc::EACCES) | Some(libc::EPERM) if mode.is_some_and(|m| m & 0o222 == 0) => {
            format!(
                " (the kernel makes this file read-only here, mode {:o}: nf_conntrack_max is \
                 writable only in the host's initial network namespace, so the writer must run \
                 with hostNetwork on a real host, not inside another network namespace)",
                mode.unwrap_or(0) & 0o777
            )
        }
        Some(libc::EACCES) | Some(libc::EPERM) => match (has(CAP_NET_ADMIN), has(CAP_SYS_ADMIN)) {
            (Some(false), _) => " (not permitted: the process lacks CAP_NET_ADMIN)".into(),
            (_, Some(false)) => {
                " (not permitted: the process lacks CAP_SYS_ADMIN, which /sys writes need)".into()
            }
            _ => " (not permitted although the process holds CAP_NET_ADMIN and CAP_SYS_ADMIN: \
                 a security module (AppArmor, SELinux, seccomp) or a user namespace refused it)"
                .into(),
        },
        _ => String::new(),
    }
}

/// The effective capability set from /proc/self/status, if it can be read.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

/// The machine's online CPUs, as kube-proxy counts them for nf_conntrack_max: not
/// `available_parallelism`, which honours the container's CPU quota and affinity, so a CPU
/// limit on the agent would shrink the node's whole table.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n >= 1 {
        return n as usize;
    }
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| count_cpu_list(&s))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Counts a kernel CPU list (`0-3,8,10-11`); `None` when it is not one.
pub fn count_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0;
    for part in s.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
        n += b.checked_sub(a)? + 1;
    }
    (n > 0).then_some(n)
}

/// Applies and logs the outcome; in dry-run only logs what it would write.
pub fn apply_and_log(args: &ConntrackSysctlArgs, roots: &Roots, dry_run: bool) -> Vec<Write> {
    let cores = online_cpus();
    if let Some(max) = args
        .conntrack_max_per_core
        .map(|pc| conntrack_max(pc, args.conntrack_min, cores))
        && !args.conntrack_max_allow_lower
        && let Some(cur) = roots.read(NF_CONNTRACK_MAX, false).filter(|c| *c > max)
    {
        tracing::info!(
            nf_conntrack_max = cur,
            computed = max,
            cores,
            "nf_conntrack_max is already higher than --conntrack-max-per-core x cores; left alone (--conntrack-max-allow-lower lowers it)"
        );
    }
    if dry_run {
        let planned = plan(args, cores, |p, sysfs| roots.read(p, sysfs));
        for w in &planned {
            tracing::info!(
                path = w.path,
                value = w.value,
                "dry-run: would set conntrack sysctl"
            );
        }
        return planned;
    }
    let (done, errors) = apply(args, cores, roots);
    for w in &done {
        tracing::info!(path = w.path, value = w.value, "set conntrack sysctl");
    }
    for e in errors {
        tracing::error!(error = %e, "could not set conntrack sysctl; stale-entry cleanup keeps running");
    }
    done
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_failed_write_says_what_was_tried_and_why() {
        let all = Some(u64::MAX);
        let no_net_admin = Some(!(1u64 << CAP_NET_ADMIN));
        let ro = write_hint(Some(libc::EROFS), Some(0o100644), all);
        assert!(ro.contains("mounted read-only"), "{ro}");
        // Privileged, but the kernel's file is 0444: not a privilege problem.
        let kernel = write_hint(Some(libc::EACCES), Some(0o100444), all);
        assert!(kernel.contains("read-only here, mode 444"), "{kernel}");
        assert!(!kernel.contains("lacks"), "{kernel}");
        let caps = write_hint(Some(libc::EPERM), Some(0o100644), no_net_admin);
        assert!(caps.contains("lacks CAP_NET_ADMIN"), "{caps}");
        let other = write_hint(Some(libc::EPERM), Some(0o100644), all);
        assert!(other.contains("security module"), "{other}");
        assert_eq!(write_hint(Some(libc::ENOENT), None, all), "");
    }

    use std::collections::HashMap;

    use super::*;

    fn args(flags: &[&str]) -> ConntrackSysctlArgs {
        testkit::cli::args(flags).unwrap()
    }

    #[test]
    fn max_is_per_core_times_cores_floored_at_min() {
        assert_eq!(conntrack_max(32768, 131072, 2), 131072);
        assert_eq!(conntrack_max(32768, 131072, 8), 262144);
        assert_eq!(conntrack_max(32768, 0, 1), 32768);
    }

    #[test]
    fn nothing_is_written_without_flags() {
        assert!(plan(&args(&[]), 4, |_, _| None).is_empty());
        // --conntrack-min alone does nothing either (as kube-proxy: max only with per-core).
        assert!(plan(&args(&["--conntrack-min", "5"]), 4, |_, _| None).is_empty());
    }

    #[test]
    fn plan_writes_only_what_differs_and_grows_the_hash() {
        let a = args(&[
            "--conntrack-max-per-core",
            "65536",
            "--conntrack-tcp-timeout-established",
            "24h",
            "--conntrack-tcp-timeout-close-wait",
            "1h",
            "--conntrack-tcp-be-liberal",
            "--conntrack-udp-timeout",
            "30s",
            "--conntrack-udp-timeout-stream",
            "2m",
        ]);
        let current: HashMap<&str, u64> = [
            ("net/netfilter/nf_conntrack_tcp_timeout_close_wait", 3600),
            (HASHSIZE, 1024),
        ]
        .into();
        let w = plan(&a, 4, |p, _| current.get(p).copied());
        let got: Vec<(&str, u64, bool)> = w.iter().map(|w| (w.path, w.value, w.sysfs)).collect();
        assert_eq!(
            got,
            vec![
                (NF_CONNTRACK_MAX, 262144, false),
                (
                    "net/netfilter/nf_conntrack_tcp_timeout_established",
                    86400,
                    false
                ),
                ("net/netfilter/nf_conntrack_udp_timeout", 30, false),
                ("net/netfilter/nf_conntrack_udp_timeout_stream", 120, false),
                ("net/netfilter/nf_conntrack_tcp_be_liberal", 1, false),
                (HASHSIZE, 65536, true),
            ]
        );
        // A hash table already big enough is left alone.
        let w = plan(&a, 4, |p, _| (p == HASHSIZE).then_some(65536));
        assert!(w.iter().all(|w| w.path != HASHSIZE));
    }

    #[test]
    fn a_higher_max_is_left_alone_unless_lowering_is_allowed() {
        let flags = ["--conntrack-max-per-core", "32768"];
        // 4 cores: computed 131072 (the floor); the node runs with 1048576.
        let current = |p: &str, _| match p {
            NF_CONNTRACK_MAX => Some(1_048_576),
            HASHSIZE => Some(262_144),
            _ => None,
        };
        let w = plan(&args(&flags), 4, current);
        assert!(w.is_empty(), "nothing lowered: {w:?}");
        let lower = args(&[flags[0], flags[1], "--conntrack-max-allow-lower"]);
        let w = plan(&lower, 4, current);
        assert_eq!(
            w,
            vec![Write {
                path: NF_CONNTRACK_MAX,
                value: 131072,
                sysfs: false
            }]
        );
        // A lower current value is raised either way; an unreadable one is written.
        for a in [args(&flags), lower] {
            let w = plan(&a, 8, |p, _| (p == NF_CONNTRACK_MAX).then_some(65536));
            assert_eq!(w[0].value, 262144);
            let w = plan(&a, 8, |_, _| None);
            assert_eq!(w[0].value, 262144);
        }
    }

    #[test]
    fn cpu_lists_are_counted_like_the_kernel_writes_them() {
        let cases = [
            ("0", Some(1)),
            ("0-1\n", Some(2)),
            ("0-3,8,10-11", Some(7)),
            ("", None),
            ("3-1", None),
            ("a-b", None),
        ];
        for (list, want) in cases {
            assert_eq!(count_cpu_list(list), want, "{list:?}");
        }
        assert!(online_cpus() >= 1);
    }

    /// A CPU limit on the agent (here its affinity, as a cpuset or a CPU manager gives it; a
    /// CFS quota acts on `available_parallelism` the same way) must not shrink the node's
    /// table: nf_conntrack_max counts the machine's online CPUs, as kube-proxy does.
    #[test]
    fn a_cpu_limit_on_the_agent_does_not_shrink_the_table() {
        let online = online_cpus();
        if online < 2 {
            testkit::skipped(
                "a_cpu_limit_on_the_agent_does_not_shrink_the_table",
                "needs 2 online CPUs",
            );
            return;
        }
        let (dir, roots, _) = fixture("gk-sysctl-cpus", "sys");
        let a = args(&["--conntrack-max-per-core", "100000", "--conntrack-min", "1"]);
        let written = std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: a zeroed cpu_set_t with CPU 0 set, for this thread only.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(0, &mut set);
                    assert_eq!(
                        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                        0
                    );
                }
                assert_eq!(
                    std::thread::available_parallelism().unwrap().get(),
                    1,
                    "the limit is in place"
                );
                apply_and_log(&a, &roots, false);
                roots.read(NF_CONNTRACK_MAX, false)
            })
            .join()
            .unwrap()
        });
        assert_eq!(written, Some(100000 * online as u64));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn be_liberal_takes_an_optional_value() {
        assert!(args(&["--conntrack-tcp-be-liberal"]).conntrack_tcp_be_liberal);
        assert!(args(&["--conntrack-tcp-be-liberal=true"]).conntrack_tcp_be_liberal);
        assert!(!args(&["--conntrack-tcp-be-liberal=false"]).conntrack_tcp_be_liberal);
        assert!(plan(&args(&["--conntrack-tcp-be-liberal=false"]), 1, |_, _| None).is_empty());
    }

    #[test]
    fn invalid_values_are_rejected_naming_them() {
        let cases: [&[&str]; 4] = [
            &["--conntrack-max-per-core", "0"],
            &["--conntrack-udp-timeout", "0s"],
            &["--conntrack-udp-timeout", "1500ms"],
            &["--conntrack-tcp-timeout-established", "soon"],
        ];
        for flags in cases {
            let e = testkit::cli::args::<ConntrackSysctlArgs>(flags)
                .err()
                .unwrap_or_else(|| panic!("{flags:?} accepted"));
            assert!(e.contains(flags[1]), "{flags:?}: {e}");
        }
    }

    /// A /proc/sys under a temp dir holding nf_conntrack_max 65536 and a 30 s UDP timeout, roots
    /// with /sys at `sys` (not created), and flags that change both.
    fn fixture(name: &str, sys: &str) -> (std::path::PathBuf, Roots, ConntrackSysctlArgs) {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let nf = dir.join("proc/net/netfilter");
        std::fs::create_dir_all(&nf).unwrap();
        std::fs::write(nf.join("nf_conntrack_max"), "65536\n").unwrap();
        std::fs::write(nf.join("nf_conntrack_udp_timeout"), "30\n").unwrap();
        let roots = Roots {
            proc_sys: dir.join("proc"),
            sys: dir.join(sys),
        };
        let a = args(&[
            "--conntrack-max-per-core",
            "100000",
            "--conntrack-udp-timeout",
            "60s",
        ]);
        (dir, roots, a)
    }

    #[test]
    fn apply_writes_under_the_roots_and_reports_read_only_paths() {
        // No such /sys directory: the hashsize write fails and is reported with its path.
        let (dir, roots, a) = fixture("gk-sysctl", "missing-sys");
        let (done, errors) = apply(&a, 2, &roots);
        assert_eq!(done.len(), 2);
        assert_eq!(roots.read(NF_CONNTRACK_MAX, false), Some(200000));
        assert_eq!(
            roots.read("net/netfilter/nf_conntrack_udp_timeout", false),
            Some(60)
        );
        assert_eq!(errors.len(), 1);
        let msg = errors[0].to_string();
        assert!(
            msg.contains("missing-sys/module/nf_conntrack/parameters/hashsize"),
            "{msg}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dry_run_plans_but_writes_nothing() {
        let (dir, roots, a) = fixture("gk-sysctl-dry", "sys");
        let planned = apply_and_log(&a, &roots, true);
        assert!(
            planned.iter().any(|w| w.path == NF_CONNTRACK_MAX),
            "{planned:?}"
        );
        assert_eq!(roots.read(NF_CONNTRACK_MAX, false), Some(65536));
        assert_eq!(
            roots.read("net/netfilter/nf_conntrack_udp_timeout", false),
            Some(30)
        );
        assert!(!dir.join("sys").exists(), "nothing created under /sys");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
