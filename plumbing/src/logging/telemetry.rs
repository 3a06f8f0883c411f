//! Structured logs in Kubernetes' formats: klog's text by default, component-base's JSON for log
//! pipelines (both in `klog.rs`), and logfmt.

use std::fmt::Write as _;

use clap::{Args, ValueEnum};

use crate::logging::klog::{ComponentJson, KlogText};
use tracing::field::{Field, Visit};
use tracing_subscriber::{
    EnvFilter,
    field::{MakeVisitor, VisitFmt, VisitOutput},
    fmt::{self, format::Writer},
    prelude::*,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// klog's text format, as kube-controller-manager's `--logging-format=text`:
    /// `I1127 20:52:17.695837       1 cycle.rs:12] "msg" key="value"`.
    Text,
    /// component-base's JSON, as kube-controller-manager's `--logging-format=json`: `ts`
    /// (Unix milliseconds), `caller`, `msg`, `v`, `err` and the fields.
    Json,
    /// logfmt, the message first: `pod gone pod=ns/name pass=orphaned` (`plain` is its older
    /// name), for logfmt pipelines and people at a terminal (coloured there).
    #[value(alias = "plain")]
    Logfmt,
}

#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log output format: `text` (klog's, the default), `json` (component-base's, for log
    /// pipelines built for Kubernetes components) or `logfmt` (`plain`).
    #[arg(
        long,
        visible_alias = "logging-format",
        env = "GROUNDSKEEPER_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Log level or tracing filter (e.g. `info`, `debug`, `info,kube=warn`). RUST_LOG, when set,
    /// takes precedence so that a filter can be changed without editing the Deployment's args.
    #[arg(long, env = "GROUNDSKEEPER_LOG_LEVEL", default_value = "info", value_parser = parse_filter)]
    pub log_level: String,

    /// klog's verbosity, as kube-controller-manager takes it (`-v 4`, `-v=4`, `--v=4`): 0-3 log
    /// at info, 4 at debug, 5 and up at trace (Kubernetes' logging conventions: 4 is debug,
    /// 5 trace). When given it replaces --log-level; RUST_LOG still takes precedence.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", value_parser = parse_verbosity)]
    pub verbosity: Option<u32>,
}

fn parse_verbosity(s: &str) -> Result<u32, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a verbosity level (a number from 0, as klog's -v)"))
}

/// The tracing level a klog verbosity stands for.
pub fn verbosity_level(v: u32) -> &'static str {
    match v {
        0..=3 => "info",
        4 => "debug",
        _ => "trace",
    }
}

fn parse_filter(s: &str) -> Result<String, String> {
    EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("not a log level or tracing filter: {e}"))
}

/// kube-client's HTTP layer logs every failed request at ERROR, with no word of which watch or
/// call it was: several lines a second during an apiserver outage. Our own code logs each failure
/// once, with context (a watch names itself), so that target is silenced unless the filter
/// names it.
const QUIET: &str = "kube_client::client::builder=off";

impl LogArgs {
    /// The filter from the flags: -v when given, else --log-level.
    pub fn level(&self) -> &str {
        match self.verbosity {
            Some(v) => verbosity_level(v),
            None => &self.log_level,
        }
    }

    fn filter(&self) -> EnvFilter {
        let with_quiet = |f: &str| {
            if f.contains("kube_client::client::builder") {
                f.to_string()
            } else {
                format!("{f},{QUIET}")
            }
        };
        match std::env::var("RUST_LOG") {
            Ok(v) if !v.is_empty() => EnvFilter::try_new(with_quiet(&v)).unwrap_or_else(|e| {
                eprintln!("RUST_LOG={v:?} is not a valid filter ({e}); using --log-level");
                EnvFilter::new(with_quiet(self.level()))
            }),
            _ => EnvFilter::new(with_quiet(self.level())),
        }
    }

    /// Installs the global subscriber. Call once, first thing in main.
    pub fn init(&self) {
        let registry = tracing_subscriber::registry().with(self.filter());
        match self.log_format {
            LogFormat::Text => registry
                .with(fmt::layer().event_format(KlogText::default()))
                .init(),
            LogFormat::Json => registry
                .with(fmt::layer().event_format(ComponentJson::default()))
                .init(),
            // Colours only for a person at a terminal, never into a log file or collector.
            LogFormat::Logfmt => registry
                .with(
                    fmt::layer()
                        .with_target(true)
                        .fmt_fields(PlainFields)
                        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout())),
                )
                .init(),
        }
    }
}

/// A list as one log value, comma-separated: `a,b,c` in plain logs and one JSON string, where
/// `?list` gave Rust's `["a", "b"]` and, in JSON logs, that text escaped inside a string.
pub fn joined<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let mut out = String::new();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{item}");
    }
    out
}

/// Plain log fields as logfmt writes them: `key=value`, a text value bare unless it needs
/// quotes (empty, or holding a space, a quote or `=`), so `ip_family=IPv4`, not
/// `ip_family="IPv4"`; the message first, unlabelled.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainFields;

impl<'w> MakeVisitor<Writer<'w>> for PlainFields {
    type Visitor = PlainVisitor<'w>;

    fn make_visitor(&self, target: Writer<'w>) -> Self::Visitor {
        PlainVisitor {
            writer: target,
            first: true,
            result: Ok(()),
        }
    }
}

pub struct PlainVisitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

impl PlainVisitor<'_> {
    fn sep(&mut self) -> &'static str {
        if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        }
    }

    fn pair(&mut self, field: &Field, value: &str, quote_always: bool) {
        if self.result.is_err() {
            return;
        }
        let sep = self.sep();
        self.result = if field.name() == "message" {
            write!(self.writer, "{sep}{value}")
        } else if quote_always || needs_quotes(value) {
            write!(self.writer, "{sep}{}={value:?}", field.name())
        } else {
            write!(self.writer, "{sep}{}={value}", field.name())
        };
    }
}

/// A value that would read as two fields, or as nothing, unquoted.
pub fn needs_quotes(v: &str) -> bool {
    v.is_empty()
        || v.chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '=' || c.is_control())
}

impl Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.pair(field, value, false);
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.pair(field, &value.to_string(), false);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // Display values (`%x`) arrive here too, already as their text.
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        self.pair(field, &text, false);
    }
}

impl VisitOutput<std::fmt::Result> for PlainVisitor<'_> {
    fn finish(self) -> std::fmt::Result {
        self.result
    }
}

impl VisitFmt for PlainVisitor<'_> {
    fn writer(&mut self) -> &mut dyn std::fmt::Write {
        &mut self.writer
    }
}

#[cfg(test)]
mod flag_tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
    }

    fn parse(args: &[&str]) -> Result<LogArgs, String> {
        Cli::try_parse_from(std::iter::once("bin").chain(args.iter().copied()))
            .map(|c| c.log)
            .map_err(|e| e.to_string())
    }

    /// kube-controller-manager's --logging-format=text|json and klog's -v, in every spelling
    /// pflag accepts.
    #[test]
    fn upstream_logging_flags() {
        for (args, want) in [
            (&["--logging-format=text"][..], LogFormat::Text),
            (&["--logging-format", "json"], LogFormat::Json),
            (&["--log-format=text"], LogFormat::Text),
            (&["--log-format=logfmt"], LogFormat::Logfmt),
            (&["--log-format=plain"], LogFormat::Logfmt),
            (&[], LogFormat::Text),
        ] {
            assert_eq!(parse(args).unwrap().log_format, want, "{args:?}");
        }
        let e = parse(&["--logging-format=yaml"]).unwrap_err();
        assert!(e.contains("yaml"), "{e}");
        for spelling in [
            &["-v", "4"][..],
            &["-v=4"],
            &["-v4"],
            &["--v=4"],
            &["--v", "4"],
        ] {
            let args = parse(spelling).unwrap();
            assert_eq!(args.verbosity, Some(4), "{spelling:?}");
            assert_eq!(args.level(), "debug", "{spelling:?}");
        }
        for bad in ["x", "-1", "2.5", "debug"] {
            let e = parse(&[&format!("--v={bad}")]).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    /// The documented mapping, and that -v replaces --log-level only when given.
    #[test]
    fn verbosity_maps_to_tracing_levels() {
        for (v, level) in [
            (0, "info"),
            (1, "info"),
            (2, "info"),
            (3, "info"),
            (4, "debug"),
            (5, "trace"),
            (10, "trace"),
        ] {
            assert_eq!(verbosity_level(v), level, "{v}");
            assert_eq!(
                parse(&[&format!("-v={v}"), "--log-level=warn"])
                    .unwrap()
                    .level(),
                level
            );
        }
        assert_eq!(parse(&["--log-level=warn"]).unwrap().level(), "warn");
        assert_eq!(parse(&[]).unwrap().level(), "info");
    }
}

#[cfg(test)]
mod plain_tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn render(f: impl FnOnce()) -> String {
        let buf = Buf::default();
        let out = buf.clone();
        let sub = tracing_subscriber::registry().with(
            fmt::layer()
                .fmt_fields(PlainFields)
                .without_time()
                .with_target(false)
                .with_ansi(false)
                .with_writer(move || out.clone()),
        );
        tracing::subscriber::with_default(sub, f);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn text_values_are_bare_unless_they_need_quotes() {
        let line = render(|| {
            tracing::info!(ip_family = "IPv4", reason = "a b", empty = "", n = 3, shown = %"x=y", "pass done");
        });
        assert!(line.contains(" pass done ip_family=IPv4 "), "{line}");
        assert!(line.contains(r#"reason="a b""#), "{line}");
        assert!(line.contains(r#"empty="""#), "{line}");
        assert!(line.contains(" n=3"), "{line}");
        assert!(line.contains(r#"shown="x=y""#), "{line}");
    }

    #[test]
    fn lists_are_joined_plainly() {
        assert_eq!(joined(["a", "b"]), "a,b");
        assert_eq!(joined(Vec::<String>::new()), "");
        let line = render(|| tracing::info!(ips = %joined(["10.0.0.1", "10.0.0.2"]), "x"));
        assert!(line.contains(" ips=10.0.0.1,10.0.0.2"), "{line}");
    }

    /// An object reference reads as it did when logged as `%"ns/name"`.
    #[test]
    fn object_references_are_ns_name() {
        use crate::logging::klog::KObj;
        let line = render(|| {
            tracing::info!(
                pod = KObj::new("ns", "p").field(),
                node = KObj::cluster("n1").field(),
                "x"
            )
        });
        assert!(line.contains(" x pod=ns/p node=n1"), "{line}");
    }

    #[test]
    fn quoting_rule() {
        for (v, q) in [
            ("IPv4", false),
            ("", true),
            ("a b", true),
            ("k=v", true),
            ("say \"hi\"", true),
            ("10.0.0.1:53", false),
        ] {
            assert_eq!(needs_quotes(v), q, "{v:?}");
        }
    }
}
