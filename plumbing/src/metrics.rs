//! The Prometheus registry both binaries expose on `/metrics`, with process metrics included.

use prometheus::{Encoder, Registry, TextEncoder};

/// A registry with the process collector (CPU, RSS, open fds) already in it.
pub fn registry() -> Registry {
    let registry = Registry::new();
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("process collector registers once");
    registry
}

/// Registers a component's collectors, stopping at the first that clashes (a name registered
/// twice is a wiring bug, reported with the name).
pub fn register_all(
    registry: &Registry,
    collectors: impl IntoIterator<Item = Box<dyn prometheus::core::Collector>>,
) -> prometheus::Result<()> {
    collectors
        .into_iter()
        .try_for_each(|c| registry.register(c))
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    // Encoding into a Vec can only fail on a malformed metric family, which the typed
    // constructors rule out.
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .expect("text encoding into memory");
    String::from_utf8(buf).expect("prometheus text is utf-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_registered_and_process_metrics() {
        let r = registry();
        let c = prometheus::IntCounter::new("groundskeeper_test_total", "help text").unwrap();
        r.register(Box::new(c.clone())).unwrap();
        c.inc();
        let text = render(&r);
        assert!(text.contains("groundskeeper_test_total 1"), "{text}");
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
    }

    #[test]
    fn register_all_stops_at_a_clash() {
        let r = Registry::new();
        let a = prometheus::IntCounter::new("groundskeeper_a_total", "a").unwrap();
        let b = prometheus::IntCounter::new("groundskeeper_b_total", "b").unwrap();
        register_all(&r, [Box::new(a.clone()) as _, Box::new(b) as _]).unwrap();
        assert!(register_all(&r, [Box::new(a) as _]).is_err());
    }
}
