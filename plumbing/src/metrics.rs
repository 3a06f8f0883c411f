//! The Prometheus registry both binaries expose on `/metrics`, with process metrics and
//! `groundskeeper_build_info` included.

use prometheus::{Encoder, IntGauge, Opts, Registry, TextEncoder};

/// What was built, as Prometheus exporters report it: a gauge that is always 1, its labels
/// saying which version, which commit (`unknown` when built outside git) and which compiler.
/// The commit and compiler are fixed by `build.rs`.
pub fn build_info() -> IntGauge {
    let opts = Opts::new(
        "groundskeeper_build_info",
        "A metric with a constant '1' value labeled by version, revision and rustc from which groundskeeper was built.",
    )
    .const_label("version", env!("CARGO_PKG_VERSION"))
    .const_label("revision", env!("GROUNDSKEEPER_REVISION"))
    .const_label("rustc", env!("GROUNDSKEEPER_RUSTC"));
    let gauge = IntGauge::with_opts(opts).expect("build_info's name and labels are valid");
    gauge.set(1);
    gauge
}

/// A registry with the process collector (CPU, RSS, open fds), `groundskeeper_build_info` and
/// client-go's REST client metrics (`crate::client::restclient`) already in it.
pub fn registry() -> Registry {
    let registry = Registry::new();
    registry
        .register(Box::new(build_info()))
        .expect("build_info registers once");
    for c in crate::client::restclient::metrics().collectors() {
        registry
            .register(c)
            .expect("the REST client metrics register once per registry");
    }
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

    /// The one build_info series, as Prometheus exporters expose it: value 1, what was built in
    /// the labels. Every binary's registry comes from `registry()`, so both expose it.
    #[test]
    fn build_info_names_version_revision_and_rustc() {
        let text = render(&registry());
        let line = text
            .lines()
            .find(|l| l.starts_with("groundskeeper_build_info{"))
            .unwrap_or_else(|| panic!("no groundskeeper_build_info series:\n{text}"));
        assert!(line.ends_with("} 1"), "{line}");
        let label = |name: &str| {
            let start = line
                .find(&format!("{name}=\""))
                .unwrap_or_else(|| panic!("{name} in {line}"));
            let rest = &line[start + name.len() + 2..];
            rest[..rest.find('"').unwrap()].to_string()
        };
        assert_eq!(label("version"), env!("CARGO_PKG_VERSION"));
        let revision = label("revision");
        assert!(
            revision == "unknown"
                || (revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())),
            "revision {revision:?} is neither a commit id nor \"unknown\""
        );
        assert!(label("rustc").starts_with("rustc 1."), "{line}");
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
