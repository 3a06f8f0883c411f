//! Network namespaces for tests and the benchmark (built only for them: `cfg(test)` or the
//! `testing` feature): create one with `ip netns add`, run code
//! inside it on a dedicated thread, delete it on drop. Nothing here touches the caller's own
//! namespace.

use std::io;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Why root/netns tests cannot run here, or `None` when they can.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    match Command::new("ip").arg("netns").arg("list").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns list` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("`ip` not runnable: {e}")),
    }
}

/// Whether the `conntrack` CLI is installed.
pub fn has_conntrack_cli() -> bool {
    Command::new("conntrack")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `f` on a new thread inside the named namespace (`/run/netns/NAME`, as `ip netns`
/// creates them); the calling thread stays where it is.
pub fn run_in<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            super::pass::round::enter_netns(name)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A named namespace, deleted on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// Creates `gk-test-<tag>-<pid>-<n>`.
    pub fn create(tag: &str) -> io::Result<Self> {
        let name = format!(
            "gk-test-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let out = Command::new("ip").args(["netns", "add", &name]).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "ip netns add {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(Self { name })
    }

    /// Runs `f` on a new thread that has joined this namespace; sockets it opens stay there.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        run_in(&self.name, f)
    }

    /// Creates `entries` in the namespace's table as live flows are (seen a reply, assured, 600 s
    /// to live); an error unless every one was created.
    pub fn fill(&self, entries: &[super::netlink::msg::Entry]) -> io::Result<()> {
        use super::netlink::msg::{STATUS_ASSURED, STATUS_SEEN_REPLY};
        let created = self.run(|| {
            super::netlink::socket::Conntrack::open()?.create(
                entries,
                600,
                STATUS_SEEN_REPLY | STATUS_ASSURED,
            )
        })??;
        if created.ok != entries.len() {
            return Err(io::Error::other(format!(
                "{} of {} entries created: {created:?}",
                created.ok,
                entries.len()
            )));
        }
        Ok(())
    }

    /// Runs a command inside the namespace (`ip netns exec`), returning stdout.
    /// (protocol, original source port, reply source = where it was DNATed to) of every IPv4
    /// entry in the namespace's table: what tests compare before and after a pass.
    pub fn ipv4_flows(
        &self,
    ) -> io::Result<std::collections::BTreeSet<(u8, u16, std::net::SocketAddr)>> {
        self.flows_of(&[super::netlink::family::Family::V4])
    }

    /// [`NetNs::ipv4_flows`] of both families.
    pub fn flows(&self) -> io::Result<std::collections::BTreeSet<(u8, u16, std::net::SocketAddr)>> {
        self.flows_of(&super::netlink::family::Family::ALL)
    }

    fn flows_of(
        &self,
        families: &[super::netlink::family::Family],
    ) -> io::Result<std::collections::BTreeSet<(u8, u16, std::net::SocketAddr)>> {
        self.run(|| {
            let mut ct = super::netlink::socket::Conntrack::open()?;
            let mut out = std::collections::BTreeSet::new();
            for fam in families {
                ct.dump(*fam, None, &mut |e| {
                    out.insert((
                        e.orig.proto,
                        e.orig.src_port,
                        std::net::SocketAddr::new(e.reply.src, e.reply.src_port),
                    ));
                })
                .map_err(|e| io::Error::other(format!("{e}")))?;
            }
            Ok(out)
        })?
    }

    pub fn exec(&self, program: &str, args: &[&str]) -> io::Result<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{program} {args:?} in {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
