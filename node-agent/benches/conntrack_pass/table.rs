//! The bench's conntrack table: entries shaped as kube-proxy's DNAT (a share of them stale),
//! written in batches, the global `nf_conntrack_max` raised for the run and put back, and the
//! peak RSS reset between figures.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use groundskeeper_node_agent::conntrack::netlink::msg::{
    Entry, IPPROTO_TCP, IPPROTO_UDP, STATUS_ASSURED, STATUS_SEEN_REPLY, Tuple,
};
use groundskeeper_node_agent::conntrack::netlink::socket::Conntrack;
use testkit::figures::status_kib;

pub(crate) const SERVICES: u32 = 100;
/// Each triggered-pass figure is the best of this many runs (with its baselines, in turn).
pub(crate) const REPEATS: usize = 5;
/// Each full-pass figure (and its baselines) is the best of this many, in turn.
pub(crate) const FULL_REPEATS: usize = 3;
/// Entries generated, created or deleted at a time.
pub(crate) const CHUNK: u32 = 8192;

pub(crate) fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// Entry `i` of the table and whether it is a stale UDP flow: one in five is UDP, and of the
/// UDP flows `stale_pct` in 20 point at the removed endpoint 10.244.99.s (so `stale_pct`% of
/// all entries), spread over every service.
pub(crate) fn entry(i: u32, stale_pct: u32) -> (Entry, bool) {
    let client = IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 128, 0, 0)) + i / 50_000,
    ));
    let cport = 10_000 + (i % 50_000) as u16;
    let k = i / 5;
    let svc = (k % SERVICES) as u8;
    let (proto, front, back, stale) = if !i.is_multiple_of(5) {
        (
            IPPROTO_TCP,
            SocketAddr::new(ip(10, 96, 1, svc), 80),
            SocketAddr::new(ip(10, 244, 7, svc), 8080),
            false,
        )
    } else if (k / SERVICES) % 20 < stale_pct {
        (
            IPPROTO_UDP,
            SocketAddr::new(ip(10, 96, 0, svc), 53),
            SocketAddr::new(ip(10, 244, 99, svc), 53),
            true,
        )
    } else {
        let ep = ((k / SERVICES) % 3) as u8;
        (
            IPPROTO_UDP,
            SocketAddr::new(ip(10, 96, 0, svc), 53),
            SocketAddr::new(ip(10, 244, ep, svc), 53),
            false,
        )
    };
    let e = Entry {
        orig: Tuple {
            src: client,
            dst: front.ip(),
            proto,
            src_port: cport,
            dst_port: front.port(),
        },
        reply: Tuple {
            src: back.ip(),
            dst: client,
            proto,
            src_port: back.port(),
            dst_port: cport,
        },
        id: None,
        zone: 0,
    };
    (e, stale)
}

/// The table's entries `which` picks, generated `CHUNK` at a time and handed to `each`: the
/// bench never holds the table or its stale list (it would count in the pass's peak RSS).
pub(crate) fn chunks(
    n: u32,
    stale_pct: u32,
    which: impl Fn(&Entry, bool) -> bool,
    mut each: impl FnMut(&[Entry]),
) {
    let mut chunk = Vec::with_capacity(CHUNK as usize);
    for i in 0..n {
        let (e, stale) = entry(i, stale_pct);
        if which(&e, stale) {
            chunk.push(e);
        }
        if chunk.len() == CHUNK as usize {
            each(&chunk);
            chunk.clear();
        }
    }
    if !chunk.is_empty() {
        each(&chunk);
    }
}

/// Creates the entries `which` picks; those still there answer EEXIST.
pub(crate) fn put_back(
    ct: &mut Conntrack,
    n: u32,
    stale_pct: u32,
    which: impl Fn(&Entry, bool) -> bool,
) {
    chunks(n, stale_pct, which, |c| {
        ct.create(c, 3600, STATUS_SEEN_REPLY | STATUS_ASSURED)
            .expect("recreate");
    });
}

pub(crate) const CONNTRACK_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

pub(crate) fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The global nf_conntrack_max raised for the run (it is read-only inside a namespace), put
/// back on drop.
pub(crate) struct RaisedMax(Option<u64>);

impl RaisedMax {
    pub(crate) fn at_least(want: u64) -> Result<Self, String> {
        let was = read_u64(CONNTRACK_MAX).ok_or_else(|| format!("cannot read {CONNTRACK_MAX}"))?;
        if was >= want {
            return Ok(Self(None));
        }
        std::fs::write(CONNTRACK_MAX, want.to_string())
            .map_err(|e| format!("{CONNTRACK_MAX} is {was} and cannot be raised to {want}: {e}"))?;
        println!("  nf_conntrack_max raised from {was} to {want} for the run (global)");
        Ok(Self(Some(was)))
    }
}

impl Drop for RaisedMax {
    fn drop(&mut self) {
        if let Some(was) = self.0 {
            let _ = std::fs::write(CONNTRACK_MAX, was.to_string());
        }
    }
}

/// Frees what the allocator keeps, then resets the peak-RSS watermark so VmHWM covers what
/// follows only.
pub(crate) fn reset_peak() -> u64 {
    // SAFETY: malloc_trim only returns free heap memory to the kernel.
    unsafe { libc::malloc_trim(0) };
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_kib(std::process::id(), "VmRSS:")
}
