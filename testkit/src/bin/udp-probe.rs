//! The UDP server and client of the real-node conntrack tests, shipped in the e2e `tools` image
//! (Debian's busybox has no UDP netcat). Like agnhost's netexec in upstream's
//! `test/e2e/network/conntrack.go`: the server answers every datagram with its own hostname; the
//! client sends from one fixed source port (so every packet belongs to one conntrack flow) and
//! logs who answered, one line per answer, so a test reads from the client's log which backend
//! its flow reaches and since when.
//!
//!   udp-probe serve PORT
//!   udp-probe send HOST:PORT SOURCE_PORT INTERVAL_MS

use std::{
    net::{ToSocketAddrs, UdpSocket},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["serve", port] => serve(port),
        ["send", target, source_port, interval_ms] => send(target, source_port, interval_ms),
        _ => Err(
            "usage: udp-probe serve PORT | udp-probe send HOST:PORT SOURCE_PORT INTERVAL_MS".into(),
        ),
    };
    if let Err(e) = result {
        eprintln!("udp-probe: {e}");
        std::process::exit(2);
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn serve(port: &str) -> Result<(), String> {
    let port: u16 = port
        .parse()
        .map_err(|_| format!("port {port:?} is not a port number"))?;
    // Both families on one socket where the pod has IPv6 (a dual-stack Service reaches it either
    // way); IPv4 alone where it has not.
    let socket = UdpSocket::bind(("::", port))
        .or_else(|_| UdpSocket::bind(("0.0.0.0", port)))
        .map_err(|e| format!("binding :{port}: {e}"))?;
    let me = hostname();
    println!("serving on :{port} as {me}");
    let mut buf = [0u8; 1500];
    loop {
        let (n, peer) = socket
            .recv_from(&mut buf)
            .map_err(|e| format!("receiving: {e}"))?;
        println!(
            "{} from {peer}: {}",
            millis(),
            String::from_utf8_lossy(&buf[..n]).trim()
        );
        // An answer that cannot be sent is the client's problem, not a reason to stop serving.
        let _ = socket.send_to(me.as_bytes(), peer);
    }
}

fn send(target: &str, source_port: &str, interval_ms: &str) -> Result<(), String> {
    let source_port: u16 = source_port
        .parse()
        .map_err(|_| format!("source port {source_port:?} is not a port number"))?;
    let interval: u64 = interval_ms
        .parse()
        .map_err(|_| format!("interval {interval_ms:?} is not a number of milliseconds"))?;
    // The source socket is of the target's family: one flow, whose conntrack entry is the
    // family's own (no v4-mapped addresses).
    let first = target
        .to_socket_addrs()
        .map_err(|e| format!("resolving {target}: {e}"))?
        .next()
        .ok_or_else(|| format!("{target} resolves to nothing"))?;
    let any = if first.is_ipv6() { "::" } else { "0.0.0.0" };
    let socket =
        UdpSocket::bind((any, source_port)).map_err(|e| format!("binding :{source_port}: {e}"))?;
    socket
        .set_read_timeout(Some(Duration::from_millis(interval.max(10))))
        .map_err(|e| e.to_string())?;
    let me = hostname();
    let mut buf = [0u8; 1500];
    for seq in 0u64.. {
        // The target is resolved again for every packet: a Service name keeps working when
        // the cluster's answer changes.
        let addr = target
            .to_socket_addrs()
            .map_err(|e| format!("resolving {target}: {e}"))?
            .next()
            .ok_or_else(|| format!("{target} resolves to nothing"))?;
        if let Err(e) = socket.send_to(format!("{me} {seq}").as_bytes(), addr) {
            println!("{} send error: {e}", millis());
        }
        match socket.recv_from(&mut buf) {
            Ok((n, _)) => println!("{} answer {}", millis(), String::from_utf8_lossy(&buf[..n])),
            Err(_) => println!("{} timeout", millis()),
        }
        std::thread::sleep(Duration::from_millis(interval));
    }
    Ok(())
}
