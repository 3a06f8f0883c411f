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

/// Where the writes go: the files under [`Roots`], or only the log ([`DryRun`]). Chosen once,
/// by [`files`].
pub trait Files {
    /// The current value, `None` when unreadable.
    fn read(&self, path: &str, sysfs: bool) -> Option<u64>;
    /// Writes one value (or, in dry-run, logs that it would).
    fn write(&self, w: &Write) -> Result<(), SysctlError>;
}

impl Files for Roots {
    fn read(&self, path: &str, sysfs: bool) -> Option<u64> {
        Roots::read(self, path, sysfs)
    }

    fn write(&self, w: &Write) -> Result<(), SysctlError> {
        let path = self.path(w.path, w.sysfs);
        match std::fs::write(&path, format!("{}\n", w.value)) {
            Ok(()) => {
                tracing::info!(path = w.path, value = w.value, "set conntrack sysctl");
                Ok(())
            }
            Err(source) => {
                let hint = write_hint(
                    source.raw_os_error(),
                    std::fs::metadata(&path).ok().map(|m| {
                        use std::os::unix::fs::PermissionsExt;
                        m.permissions().mode()
                    }),
                    effective_caps(),
                );
                Err(SysctlError {
                    path,
                    value: w.value,
                    source,
                    hint,
                })
            }
        }
    }
}

/// The files read as usual; the writes only logged, never made.
pub struct DryRun<'a>(pub &'a Roots);

impl Files for DryRun<'_> {
    fn read(&self, path: &str, sysfs: bool) -> Option<u64> {
        self.0.read(path, sysfs)
    }

    fn write(&self, w: &Write) -> Result<(), SysctlError> {
        tracing::info!(
            path = w.path,
            value = w.value,
            "dry-run: would set conntrack sysctl"
        );
        Ok(())
    }
}

/// The files the sysctls are written to, or not: dry-run is decided here only.
pub fn files(roots: &Roots, dry_run: bool) -> Box<dyn Files + '_> {
    if dry_run {
        Box::new(DryRun(roots))
    } else {
        Box::new(roots.clone())
    }
}

/// Plans and writes; every write is tried, each failure returned (the caller logs them and
/// keeps running the cleanup).
pub fn apply(
    args: &ConntrackSysctlArgs,
    cores: usize,
    files: &dyn Files,
) -> (Vec<Write>, Vec<SysctlError>) {
    let writes = plan(args, cores, |p, sysfs| files.read(p, sysfs));
    let mut errors = Vec::new();
    let mut done = Vec::new();
    for w in writes {
        match files.write(&w) {
            Ok(()) => done.push(w),
            Err(e) => errors.push(e),
        }
    }
    (done, errors)
}

pub(super) const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;

/// Why a write failed, from what was tried and what the process can see: blaming privileges
/// alone would mislead in a privileged container, where the cause is the kernel's (a sysctl
/// that is read-only outside the host's network namespace).
pub(super) fn write_hint(errno: Option<i32>, mode: Option<u32>, caps: Option<u64>) -> String {
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

/// Applies and logs the outcome; in dry-run ([`files`]) only logs what it would write.
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
    let (done, errors) = apply(args, cores, &*files(roots, dry_run));
    for e in errors {
        tracing::error!(error = %e, "could not set conntrack sysctl; stale-entry cleanup keeps running");
    }
    done
}
