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

/// `metric`, registered in `registry`: a component's metrics struct is built field by field
/// with this, so no metric is left unregistered and no list repeats the fields. A name
/// registered twice is a wiring bug, reported with the name.
pub fn registered<M>(registry: &Registry, metric: prometheus::Result<M>) -> prometheus::Result<M>
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
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
    fn registered_twice_is_an_error() {
        let r = Registry::new();
        let new = || prometheus::IntCounter::new("groundskeeper_a_total", "a");
        registered(&r, new()).unwrap().inc();
        assert!(registered(&r, new()).is_err());
        assert!(render(&r).contains("groundskeeper_a_total 1"));
    }
}
