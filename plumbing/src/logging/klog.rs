//! Kubernetes' own log formats as tracing-subscriber formatters, so the pipelines and habits
//! built for kube-controller-manager read ours: klog's text header
//! (`I1127 20:52:17.695837       1 cycle.rs:12] "msg" key="value"`) and component-base's JSON
//! (`{"ts":1732740737695.837,"caller":"podgc/cycle.rs:12","msg":"…","v":0,"key":"value"}`).
//!
//! Levels map as klog's do onto logr: ERROR is an error (`E`, no `v`, its `error` field as
//! `err`), WARN a warning (`W` in text; logr has no warning, so `v` 0 in JSON, as klog's
//! `Warning` through a logr backend), INFO `v` 0, DEBUG `v` 4 and TRACE `v` 5 (Kubernetes'
//! logging conventions, and `-v`'s mapping in `telemetry.rs`). A field named `error` is
//! written as `err`, the key every Kubernetes component uses. An object reference ([`KObj`]) is
//! `ns/name` in text and `{"name":"…","namespace":"…"}` in JSON, as klog's `KObj` and `KRef`.

use std::{fmt, fmt::Write as _, time::SystemTime};

use tracing::{
    Event, Level, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    registry::LookupSpan,
};

/// How a log line reads the clock: the system's, or a fixed instant in tests.
pub type Clock = fn() -> SystemTime;

/// klog's text format.
#[derive(Clone, Copy)]
pub struct KlogText {
    pub clock: Clock,
}

/// component-base's JSON format (`--logging-format=json`).
#[derive(Clone, Copy)]
pub struct ComponentJson {
    pub clock: Clock,
}

impl Default for KlogText {
    fn default() -> Self {
        Self {
            clock: SystemTime::now,
        }
    }
}

impl Default for ComponentJson {
    fn default() -> Self {
        Self {
            clock: SystemTime::now,
        }
    }
}

/// An object reference as a log value, as klog's `KObj` and `KRef` write one: `ns/name` (a
/// cluster-scoped object's `name`) in klog's text and in logfmt, `{"name":"n","namespace":"ns"}`
/// in component-base's JSON, the namespace left out for a cluster-scoped object. Recorded
/// with [`KObj::field`]: `tracing::info!(pod = KObj::new(ns, name).field(), "…")`.
///
/// tracing hands a formatter a field's value as text, a number, or an error; only the error
/// keeps its type (`downcast_ref`), so a reference travels as one and the JSON formatter knows
/// it. Every other formatter writes an error by its `Display`: `ns/name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KObj {
    namespace: String,
    name: String,
}

impl KObj {
    /// klog's `KRef(namespace, name)`: an empty namespace is a cluster-scoped object.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// A cluster-scoped object (a Node, a ServiceCIDR).
    pub fn cluster(name: &str) -> Self {
        Self::new("", name)
    }

    /// klog's `KObj(obj)`: the object's namespace, if it has one, and its name.
    pub fn of<K: kube::Resource>(obj: &K) -> Self {
        let meta = obj.meta();
        Self::new(
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        )
    }

    /// The value to record in a tracing field.
    pub fn field(&self) -> &(dyn std::error::Error + 'static) {
        self
    }

    pub fn namespace(&self) -> Option<&str> {
        Some(self.namespace.as_str()).filter(|ns| !ns.is_empty())
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for KObj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.namespace() {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl std::error::Error for KObj {}

/// One field's value as the event recorded it: numbers and booleans keep their type (bare in
/// text, JSON numbers), an object reference is one, everything else is text.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Text(String),
    Ref(KObj),
    I64(i64),
    U64(u64),
    F64(f64),
    Bool(bool),
}

/// The message and the fields of one event, `error` renamed `err`.
#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(&'static str, Value)>,
}

impl Fields {
    fn of(event: &Event<'_>) -> Self {
        let mut f = Fields::default();
        event.record(&mut f);
        f
    }

    fn push(&mut self, field: &Field, value: Value) {
        match (field.name(), value) {
            ("message", Value::Text(t)) => self.message = t,
            ("error" | "err", v) => self.pairs.push(("err", v)),
            (name, v) => self.pairs.push((name, v)),
        }
    }

    /// The `err` pair taken out (an error event writes it apart from the others).
    fn take_err(&mut self) -> Option<Value> {
        let i = self.pairs.iter().position(|(k, _)| *k == "err")?;
        Some(self.pairs.remove(i).1)
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, Value::Text(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, Value::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, Value::U64(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, Value::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        match value.downcast_ref::<KObj>() {
            Some(r) => self.push(field, Value::Ref(r.clone())),
            None => self.push(field, Value::Text(value.to_string())),
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // Display values (`%x`) and the message arrive here too, already as their text.
        self.push(field, Value::Text(format!("{value:?}")));
    }
}

/// klog's severity letter.
fn severity(level: &Level) -> char {
    match *level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    }
}

/// logr's verbosity of a level; `None` for an error, which has none.
pub fn verbosity(level: &Level) -> Option<u8> {
    match *level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(4),
        Level::TRACE => Some(5),
    }
}

/// `dir/file.rs:line`, as zap's short caller (the file's last directory and name); the event's
/// target when it has no file.
fn short_caller(event: &Event<'_>) -> String {
    let meta = event.metadata();
    let Some(file) = meta.file() else {
        return meta.target().to_string();
    };
    let mut parts = file.rsplit(['/', '\\']);
    let name = parts.next().unwrap_or(file);
    let short = match parts.next() {
        Some(dir) => format!("{dir}/{name}"),
        None => name.to_string(),
    };
    format!("{short}:{}", meta.line().unwrap_or(0))
}

/// `file.rs:line` as klog's header writes it (the base name); a `mod.rs` keeps its directory,
/// which is the module's name.
fn header_caller(event: &Event<'_>) -> String {
    let short = short_caller(event);
    match short.split_once('/') {
        Some((_, rest)) if !rest.starts_with("mod.rs:") => rest.to_string(),
        _ => short,
    }
}

/// Go's `strconv.Quote`: double quotes, backslash escapes for quotes, backslashes and control
/// characters (and the Unicode line separators); printable Unicode as it is.
pub fn go_quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => escape_control(c, out),
        }
    }
    out.push('"');
}

/// `c`, or Go's escape for it when it is a control character or a line separator: what a
/// terminal or a log viewer would act on (a carriage return, an escape sequence) is written as
/// text. A tab stays a tab only where the caller writes it itself.
fn escape_control(c: char, out: &mut String) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{7}' => out.push_str("\\a"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        '\u{b}' => out.push_str("\\v"),
        c if (c as u32) < 0x20 || c == '\u{7f}' => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
        c => out.push(c),
    }
}

/// A text value as klog's key/value format writes it: quoted, or, holding a line break, one
/// tab-indented line per line between `<` and ` >` (klog's multi-line form). Unlike klog, the
/// other control characters of such a line are escaped too, so no value can move a terminal's
/// cursor over the lines before it.
fn klog_text_value(s: &str, out: &mut String) {
    if !s.contains('\n') {
        go_quote(s, out);
        return;
    }
    out.push_str("<\n");
    let line = |l: &str, out: &mut String| {
        out.push('\t');
        l.chars().for_each(|c| match c {
            '\t' => out.push(c),
            c => escape_control(c, out),
        });
        out.push('\n');
    };
    let mut rest = s;
    while let Some(i) = rest.find('\n') {
        line(&rest[..i], out);
        rest = &rest[i + 1..];
    }
    if !rest.is_empty() {
        line(rest, out);
    }
    out.push_str(" >");
}

fn klog_pair(key: &str, value: &Value, out: &mut String) {
    out.push(' ');
    out.push_str(key);
    out.push('=');
    match value {
        Value::Text(t) => klog_text_value(t, out),
        Value::Ref(r) => klog_text_value(&r.to_string(), out),
        Value::I64(n) => {
            let _ = write!(out, "{n}");
        }
        Value::U64(n) => {
            let _ = write!(out, "{n}");
        }
        Value::F64(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
    }
}

/// The header's time, `mmdd hh:mm:ss.uuuuuu`, in UTC.
fn klog_time(t: SystemTime, out: &mut String) {
    let ts = jiff::Timestamp::try_from(t).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let d = ts.to_zoned(jiff::tz::TimeZone::UTC).datetime();
    let _ = write!(
        out,
        "{:02}{:02} {:02}:{:02}:{:02}.{:06}",
        d.month(),
        d.day(),
        d.hour(),
        d.minute(),
        d.second(),
        d.subsec_nanosecond() / 1000
    );
}

impl KlogText {
    /// One line (with its newline) for `event`.
    fn line(&self, event: &Event<'_>) -> String {
        let meta = event.metadata();
        let mut f = Fields::of(event);
        let mut out = String::with_capacity(128);
        out.push(severity(meta.level()));
        klog_time((self.clock)(), &mut out);
        let _ = write!(out, " {:>7} {}] ", std::process::id(), header_caller(event));
        go_quote(&f.message, &mut out);
        // klog's ErrorS writes the error first.
        if *meta.level() == Level::ERROR
            && let Some(err) = f.take_err()
        {
            klog_pair("err", &err, &mut out);
        }
        for (k, v) in &f.pairs {
            klog_pair(k, v, &mut out);
        }
        out.push('\n');
        out
    }
}

fn json_value(value: &Value, out: &mut String) {
    match value {
        Value::Text(t) => json_string(t, out),
        // zapr writes klog's ObjectRef through its MarshalLog: name, then a namespace if any.
        Value::Ref(r) => {
            out.push_str("{\"name\":");
            json_string(r.name(), out);
            if let Some(ns) = r.namespace() {
                out.push_str(",\"namespace\":");
                json_string(ns, out);
            }
            out.push('}');
        }
        Value::I64(n) => {
            let _ = write!(out, "{n}");
        }
        Value::U64(n) => {
            let _ = write!(out, "{n}");
        }
        // JSON has no NaN or infinity: those are written as text.
        Value::F64(n) if !n.is_finite() => json_string(&n.to_string(), out),
        Value::F64(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
    }
}

fn json_string(s: &str, out: &mut String) {
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
}

/// Unix time in milliseconds as a float, as component-base's `epochMillisTimeEncoder`.
fn epoch_millis(t: SystemTime) -> f64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as f64 / 1e6,
        Err(e) => -(e.duration().as_nanos() as f64) / 1e6,
    }
}

impl ComponentJson {
    /// One object (with its newline) for `event`, keys in zap's order: `ts`, `caller`, `msg`,
    /// then `v`, the fields, and an error's `err` last (zapr's order).
    fn line(&self, event: &Event<'_>) -> String {
        let meta = event.metadata();
        let mut f = Fields::of(event);
        let mut out = String::with_capacity(160);
        let _ = write!(out, "{{\"ts\":{}", epoch_millis((self.clock)()));
        out.push_str(",\"caller\":");
        json_string(&short_caller(event), &mut out);
        out.push_str(",\"msg\":");
        json_string(&f.message, &mut out);
        let v = verbosity(meta.level());
        let err = if v.is_none() { f.take_err() } else { None };
        if let Some(v) = v {
            let _ = write!(out, ",\"v\":{v}");
        }
        if let Some(err) = err {
            f.pairs.push(("err", err));
        }
        for (k, value) in &f.pairs {
            out.push(',');
            json_string(k, &mut out);
            out.push(':');
            json_value(value, &mut out);
        }
        out.push_str("}\n");
        out
    }
}

impl<S, N> FormatEvent<S, N> for KlogText
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writer.write_str(&self.line(event))
    }
}

impl<S, N> FormatEvent<S, N> for ComponentJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writer.write_str(&self.line(event))
    }
}
