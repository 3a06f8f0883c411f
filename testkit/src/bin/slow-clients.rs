//! A hostile pod of the end-to-end tests, shipped in the `tools` image: against each HTTPS
//! server given, it holds SILENT TCP connections that never say anything, plus SLOW connections
//! that complete TLS and then dribble a request's headers or body a byte at a time, each opened
//! again as soon as the server closes it, for SECONDS; then it prints what it opened and what was
//! closed on it, and exits.
//!
//!   slow-clients SILENT SLOW SECONDS HOST:PORT...

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use testkit::hostile::{Attack, Tally, Target, attack, raise_open_files};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: slow-clients SILENT SLOW SECONDS HOST:PORT...";
    let (Some(silent), Some(slow), Some(seconds)) = (
        args.first().and_then(|a| a.parse::<usize>().ok()),
        args.get(1).and_then(|a| a.parse::<usize>().ok()),
        args.get(2).and_then(|a| a.parse::<u64>().ok()),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let targets: Vec<SocketAddr> = args[3..]
        .iter()
        .filter_map(|t| t.to_socket_addrs().ok()?.next())
        .collect();
    if targets.is_empty() || targets.len() != args.len() - 3 {
        eprintln!("{usage}: every target must be HOST:PORT");
        std::process::exit(2);
    }
    let files = raise_open_files(((silent + slow) * targets.len() * 2 + 256) as u64);
    println!("slow-clients: open files limit {files}");
    let mut sets = Vec::new();
    let mut tallies = Vec::new();
    for addr in &targets {
        let target = Target::unverified(*addr);
        let source: IpAddr = if addr.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let tally = Arc::new(Tally::default());
        let pause = Duration::from_millis(200);
        sets.push(attack(
            &target,
            source,
            silent,
            Attack::Silent,
            pause,
            tally.clone(),
        ));
        let each = slow.div_ceil(3);
        for what in [
            Attack::SlowHeaders,
            Attack::SlowBody {
                path: "/validate/pod",
                len: Some(200_000),
            },
            Attack::SlowBody {
                path: "/validate/binding",
                len: None,
            },
        ] {
            sets.push(attack(&target, source, each, what, pause, tally.clone()));
        }
        tallies.push((*addr, tally));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    for (addr, t) in tallies {
        println!(
            "slow-clients: {addr}: {} connections opened, {} closed on us",
            t.opened(),
            t.closed()
        );
    }
    for mut s in sets {
        s.abort_all();
    }
}
