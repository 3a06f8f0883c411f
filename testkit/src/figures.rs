//! What the benches print and read of a child process: `bench <name> <value> <unit>` lines, and
//! a process's memory and CPU time from /proc.

/// Prints one figure as the line every bench run can be compared on. Ratios and values under
/// 10 keep more digits (0.85 vs 0.8; a 0.009 ms update is not 0.0).
pub fn bench(name: &str, value: f64, unit: &str) {
    println!("bench {name} {}", figure(value, unit));
}

/// A value and its unit as a `bench` line shows them.
pub fn figure(value: f64, unit: &str) -> String {
    match value.abs() {
        _ if unit == "ratio" => format!("{value:.2} {unit}"),
        v if v != 0.0 && v < 1.0 => format!("{value:.3} {unit}"),
        v if v < 10.0 => format!("{value:.2} {unit}"),
        _ => format!("{value:.1} {unit}"),
    }
}

/// A bench's positional numbers (`cargo bench --bench NAME -- 100 10`: cargo adds `--bench`,
/// which is skipped); an error naming the argument that is not a number.
pub fn bench_args() -> anyhow::Result<Vec<u64>> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| {
            a.parse()
                .map_err(|e| anyhow::anyhow!("argument {a:?}: {e}"))
        })
        .collect()
}

/// A numeric knob from the environment; `default` when unset or not a number.
pub fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A field of /proc/PID/status in KiB, e.g. `VmRSS:` or `VmHWM:` (0 when the process is gone).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// User plus system CPU time of `pid`, in seconds (0 when the process is gone).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / hz
}
