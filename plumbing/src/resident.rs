//! What the process keeps resident.
//!
//! Idle, either binary's private memory (heap, stacks) is under 2 MiB; most of its RSS is code:
//! its own binary's and glibc's, mapped from the page cache. Start-up runs code that never runs
//! again (flag parsing, the first list of every watch, certificate generation, the first pass of
//! each component), and the kernel maps code into a process 64 KiB or a whole page-cache folio
//! around every page that runs, so by the time the process is ready some 14 MiB of code count
//! in its RSS, most of it never run again.
//!
//! Once the process has been ready for [`AFTER_READY`], and every [`EVERY`] after that,
//! [`release_unused_pages`] unmaps the resident pages of its private read-only file mappings
//! (code, constants, unwind tables; of the binary and of its libraries) with `MADV_DONTNEED`.
//! The pages stay in the page cache, where the kernel can reclaim them; what runs afterwards
//! maps its pages back on a minor fault (a few hundred, well under a millisecond in all), so
//! the RSS that remains is the code the process has run since. A mapping with any page of its
//! own (`Anonymous:` in smaps: relocated data, a debugger's breakpoint) is never touched: for a
//! private mapping, `MADV_DONTNEED` would throw such a page away and map the file's original
//! back.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Readiness;

/// How long after the process became ready its start-up pages are released: past the first
/// pass of every component (a ServiceCIDR sync, a PodGC cycle, a conntrack pass).
pub const AFTER_READY: Duration = Duration::from_secs(30);

/// How often, after that, code not run since the last release stops being mapped. A minute:
/// the RSS an admin sees is the code run in the last minute, not what a burst of work mapped
/// minutes ago. The idle loop (lease renewals, watches, PodGC cycles, conntrack passes) maps
/// its pages back within seconds, a few hundred minor faults; a release reads smaps and
/// trims the heap, about a millisecond: well under 0.1 ms of CPU a second together.
pub const EVERY: Duration = Duration::from_secs(60);

/// One mapping of `/proc/self/smaps`, as far as the decision needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    pub perms: String,
    pub path: String,
    /// Pages of this mapping that are the process's own (copied on write), in KiB.
    pub anonymous_kib: u64,
    pub rss_kib: u64,
}

/// A mapping whose resident pages can be dropped without losing anything: a private,
/// read-only mapping of a file with no page of its own.
pub fn releasable(m: &Mapping) -> bool {
    m.path.starts_with('/')
        && m.perms.len() == 4
        && m.perms.starts_with('r')
        && &m.perms[1..2] == "-"
        && m.perms.ends_with('p')
        && m.anonymous_kib == 0
        && m.end > m.start
}

/// Parses `/proc/self/smaps`. Fields it does not know are skipped; a line that is neither a
/// field nor a header it can read ends the mapping before it, and the fields after it count for
/// no mapping (nothing is released on a guess).
pub fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    let mut current: Option<Mapping> = None;
    for line in text.lines() {
        if let Some(m) = header(line) {
            out.extend(current.take());
            current = Some(m);
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(key), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !key.ends_with(':') {
            // Neither a field nor a header we can read: what follows belongs to no mapping
            // we know.
            out.extend(current.take());
            continue;
        }
        let Some(m) = current.as_mut() else { continue };
        let Ok(kib) = value.parse::<u64>() else {
            continue;
        };
        match key {
            "Anonymous:" => m.anonymous_kib = kib,
            "Rss:" => m.rss_kib = kib,
            _ => {}
        }
    }
    out.extend(current);
    out
}

/// `start-end perms offset dev inode [path]`; the path may hold spaces.
fn header(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    if perms.len() != 4 {
        return None;
    }
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?.parse::<u64>().ok()?;
    let path = fields.next().unwrap_or("").trim_start().to_string();
    Some(Mapping {
        start,
        end,
        perms: perms.to_string(),
        path,
        anonymous_kib: 0,
        rss_kib: 0,
    })
}

/// Hands the heap's free pages back to the kernel (glibc's `malloc_trim`, which also releases
/// free pages inside the heap, not only at its top). A cache that listed 150k objects a page at
/// a time is left with pages freed between its long-lived entries, which free() alone keeps
/// resident; a component calls this after its bursts (PodGC: after each cycle).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks malloc's own free lists, under its lock.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What a release did: the mappings released, and their resident KiB before.
#[derive(Debug, Default, PartialEq)]
pub struct Released {
    pub mappings: usize,
    pub resident_kib: u64,
}

/// Unmaps the resident pages of the process's private read-only file mappings (see the
/// module's comment).
pub fn release_unused_pages() -> std::io::Result<Released> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut done = Released::default();
    for m in parse_smaps(&smaps).iter().filter(|m| releasable(m)) {
        // SAFETY: the range is a whole private mapping of a file, not writable and with no
        // page of its own (checked above): MADV_DONTNEED only unmaps pages that the next
        // access maps back, unchanged, from the file. Executables and libraries are replaced
        // by renaming, never rewritten in place (the kernel refuses writes to a running
        // binary), so the file still holds what was mapped.
        let rc = unsafe {
            libc::madvise(
                m.start as *mut libc::c_void,
                m.end - m.start,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        done.mappings += 1;
        done.resident_kib += m.rss_kib;
    }
    Ok(done)
}

/// Once the process has been ready for [`AFTER_READY`], and every [`EVERY`] after that,
/// releases the pages of code not run since and the heap's free pages. Stops on `token`.
pub async fn release_while_running(readiness: Readiness, token: CancellationToken) {
    let ready = async {
        // Not `is_ready`: before the components have registered their watches, it is true.
        while !readiness.has_listed() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tokio::time::sleep(AFTER_READY).await;
    };
    tokio::select! {
        _ = token.cancelled() => return,
        _ = ready => {}
    }
    loop {
        release_free_memory();
        match release_unused_pages() {
            Ok(r) => tracing::debug!(
                mappings = r.mappings,
                resident_kib = r.resident_kib,
                "released the pages of code not run lately"
            ),
            Err(e) => {
                tracing::info!(error = %e, "could not release the pages of code not run lately");
                return;
            }
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}
