//! Structured logs: plain text for people by default, one JSON object per line for log pipelines.

use clap::{Args, ValueEnum};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

#[derive(Args, Clone, Debug)]
pub struct LogArgs {
    /// Log output format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "plain")]
    pub log_format: LogFormat,

    /// Log level or tracing filter (e.g. `info`, `debug`, `info,kube=warn`). RUST_LOG, when set,
    /// takes precedence so that a filter can be changed without editing the Deployment's args.
    #[arg(long, env = "LOG_LEVEL", default_value = "info", value_parser = parse_filter)]
    pub log_level: String,
}

fn parse_filter(s: &str) -> Result<String, String> {
    EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("not a log level or tracing filter: {e}"))
}

impl LogArgs {
    fn filter(&self) -> EnvFilter {
        match std::env::var("RUST_LOG") {
            Ok(v) if !v.is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
                eprintln!("RUST_LOG={v:?} is not a valid filter ({e}); using --log-level");
                EnvFilter::new(&self.log_level)
            }),
            _ => EnvFilter::new(&self.log_level),
        }
    }

    /// Installs the global subscriber. Call once, first thing in main.
    pub fn init(&self) {
        let registry = tracing_subscriber::registry().with(self.filter());
        match self.log_format {
            // Colours only for a person at a terminal, never into a log file or collector.
            LogFormat::Plain => registry
                .with(
                    fmt::layer()
                        .with_target(true)
                        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout())),
                )
                .init(),
            LogFormat::Json => registry
                .with(
                    fmt::layer()
                        .json()
                        .flatten_event(true)
                        .with_current_span(false)
                        .with_span_list(false),
                )
                .init(),
        }
    }
}
