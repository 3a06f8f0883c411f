//! What the process keeps resident once it has started.
//!
//! Idle, either binary's private memory (heap, stacks) is under 2 MiB; most of its RSS is its
//! own code. Start-up runs code that never runs again (flag parsing, the first list of every
//! watch, certificate generation, the first pass of each component), and the kernel maps a
//! binary's code into a process 64 KiB around every page it runs, so by the time the process is
//! ready some 12 MiB of a 14 MiB code segment count in its RSS, most of it never touched again.
//!
//! Once the process has been ready for a while, [`release_start_up_pages`] unmaps the binary's
//! read-only segments (code, constants, unwind tables) with `MADV_DONTNEED`. The pages stay in
//! the page cache, where the kernel can reclaim them; what runs afterwards maps its pages back
//! on a minor fault, so the RSS that remains is the code the process actually keeps running.
//! A segment with any page of its own (`Anonymous:` in smaps: relocated data, a debugger's
//! breakpoint) is never touched: for a private mapping, `MADV_DONTNEED` would throw such a page
//! away and map the file's original back.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Readiness;

/// How long after the process became ready its start-up pages are released: past the first
/// pass of every component (a ServiceCIDR sync, a PodGC cycle, a conntrack pass).
pub const AFTER_READY: Duration = Duration::from_secs(30);

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

/// A mapping whose resident pages can be dropped without losing anything: a private, read-only
/// mapping of the binary itself with no page of its own.
pub fn releasable(m: &Mapping, exe: &str) -> bool {
    m.path == exe
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

/// What a release did: the binary's resident KiB in the mappings released, before.
#[derive(Debug, Default, PartialEq)]
pub struct Released {
    pub mappings: usize,
    pub resident_kib: u64,
}

/// Unmaps the resident pages of the binary's read-only segments (see the module's comment).
pub fn release_start_up_pages() -> std::io::Result<Released> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let exe = exe.to_string_lossy();
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut done = Released::default();
    for m in parse_smaps(&smaps).iter().filter(|m| releasable(m, &exe)) {
        // SAFETY: the range is a whole mapping of the process's own binary, private, not
        // writable and with no page of its own (checked above): MADV_DONTNEED only unmaps
        // pages that the next access maps back, unchanged, from the file (which the kernel
        // keeps from being written while it runs).
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

/// Once the process has been ready for [`AFTER_READY`], releases its start-up pages and the
/// heap's free pages, once, and logs what it released. Stops early on `token`.
pub async fn release_after_start(readiness: Readiness, token: CancellationToken) {
    let ready = async {
        while !readiness.is_ready() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tokio::time::sleep(AFTER_READY).await;
    };
    tokio::select! {
        _ = token.cancelled() => return,
        _ = ready => {}
    }
    crate::process::release_free_memory();
    match release_start_up_pages() {
        Ok(r) => tracing::debug!(
            mappings = r.mappings,
            resident_kib = r.resident_kib,
            "released the start-up pages of the binary's code"
        ),
        Err(e) => {
            tracing::info!(error = %e, "could not release the start-up pages of the binary's code")
        }
    }
}

#[cfg(test)]
#[path = "resident_tests.rs"]
mod tests;
