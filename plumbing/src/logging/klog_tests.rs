//! klog's text and component-base's JSON, line by line: the header, quoting, levels, `err`, and
//! what a JSON pipeline for kube-controller-manager reads.

use std::{
    sync::{Arc, Mutex},
    time::SystemTime,
};

use tracing_subscriber::{fmt, prelude::*};

use crate::logging::klog::*;

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

/// 2024-11-27T20:52:17.695837Z.
fn fixed() -> SystemTime {
    "2024-11-27T20:52:17.695837Z"
        .parse::<jiff::Timestamp>()
        .unwrap()
        .into()
}

fn render<E>(format: E, f: impl FnOnce()) -> String
where
    E: for<'w> fmt::FormatEvent<tracing_subscriber::Registry, fmt::format::DefaultFields>
        + Send
        + Sync
        + 'static,
{
    let buf = Buf::default();
    let out = buf.clone();
    let sub = tracing_subscriber::registry().with(
        fmt::layer()
            .event_format(format)
            .with_writer(move || out.clone()),
    );
    tracing::subscriber::with_default(sub, f);
    String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
}

fn text(f: impl FnOnce()) -> String {
    render(KlogText { clock: fixed }, f)
}

fn json(f: impl FnOnce()) -> String {
    render(ComponentJson { clock: fixed }, f)
}

/// The header: severity, `mmdd hh:mm:ss.uuuuuu` (UTC), the process id right-aligned in seven
/// columns, `file:line]`.
#[test]
fn text_header_is_klogs() {
    let line = text(|| tracing::info!("started"));
    let line = line.strip_suffix('\n').expect("one line, ended");
    let (header, rest) = line.split_once("] ").expect("klog's `] `");
    assert_eq!(rest, r#""started""#);
    let want = format!(
        "I1127 20:52:17.695837 {:>7} klog_tests.rs:",
        std::process::id()
    );
    assert!(header.starts_with(&want), "{header:?} / {want:?}");
    let line_no = &header[want.len()..];
    assert!(
        !line_no.is_empty() && line_no.bytes().all(|b| b.is_ascii_digit()),
        "{header}"
    );
}

/// Each row fails on its own, named: what klog's key/value format writes after the header.
#[test]
fn text_lines() {
    type Emit = fn();
    let rows: &[(&str, Emit, char, &str)] = &[
        (
            "strings quoted, numbers and booleans bare",
            || {
                tracing::info!(
                    ip_family = "IPv4",
                    n = 3,
                    ok = true,
                    ratio = 0.5,
                    "pass done"
                )
            },
            'I',
            r#""pass done" ip_family="IPv4" n=3 ok=true ratio=0.5"#,
        ),
        (
            "Display and Debug values are text, quoted",
            || tracing::info!(pod = %"ns/p", list = ?["a"], "x"),
            'I',
            r#""x" pod="ns/p" list="[\"a\"]""#,
        ),
        (
            "a warning is W",
            || tracing::warn!(watch = "podgc/pods", "watch failed"),
            'W',
            r#""watch failed" watch="podgc/pods""#,
        ),
        (
            "an error is E with err first, as klog's ErrorS",
            || tracing::error!(pod = "ns/p", error = %"boom", "delete failed"),
            'E',
            r#""delete failed" err="boom" pod="ns/p""#,
        ),
        (
            "an error field of an info line is err, in place",
            || tracing::info!(pod = "ns/p", error = %"gone", n = 1, "retrying"),
            'I',
            r#""retrying" pod="ns/p" err="gone" n=1"#,
        ),
        (
            "debug and trace lines are I (klog's V levels)",
            || tracing::debug!("detail"),
            'I',
            r#""detail""#,
        ),
        (
            "quotes, backslashes and control characters escaped as Go's %q",
            || tracing::info!(v = "a\tb\\c\u{1}", "say \"hi\"\n"),
            'I',
            r#""say \"hi\"\n" v="a\tb\\c\x01""#,
        ),
        (
            "a value with line breaks in klog's multi-line form",
            || tracing::info!(v = "one\ntwo", w = "three\n", "m"),
            'I',
            "\"m\" v=<\n\tone\n\ttwo\n > w=<\n\tthree\n >",
        ),
        (
            "an empty message and an empty value",
            || tracing::info!(v = "", ""),
            'I',
            r#""" v="""#,
        ),
    ];
    for (name, emit, sev, want) in rows {
        let out = text(*emit);
        assert!(out.starts_with(*sev), "{name}: {out:?}");
        let body = out
            .split_once("] ")
            .map(|(_, b)| b)
            .unwrap_or_else(|| panic!("{name}: no header in {out:?}"));
        assert_eq!(body, format!("{want}\n"), "{name}");
    }
}

/// The JSON keys component-base writes, in zap's order, with the fields' own types.
#[test]
fn json_lines() {
    type Emit = fn();
    let rows: &[(&str, Emit, &str)] = &[
        (
            "info: v 0, typed fields",
            || tracing::info!(ip_family = "IPv4", n = 3, ok = true, "pass done"),
            r#""msg":"pass done","v":0,"ip_family":"IPv4","n":3,"ok":true}"#,
        ),
        (
            "warn: v 0 (logr has no warning)",
            || tracing::warn!(watch = "podgc/pods", "watch failed"),
            r#""msg":"watch failed","v":0,"watch":"podgc/pods"}"#,
        ),
        (
            "debug: v 4",
            || tracing::debug!("detail"),
            r#""msg":"detail","v":4}"#,
        ),
        (
            "trace: v 5",
            || tracing::trace!("more"),
            r#""msg":"more","v":5}"#,
        ),
        (
            "error: no v, err last",
            || tracing::error!(error = %"boom", pod = "ns/p", "delete failed"),
            r#""msg":"delete failed","pod":"ns/p","err":"boom"}"#,
        ),
        (
            "an info line's error field is err, in place",
            || tracing::info!(error = %"gone", n = 1, "retrying"),
            r#""msg":"retrying","v":0,"err":"gone","n":1}"#,
        ),
        (
            "escaping is JSON's; a float that JSON cannot hold is text",
            || tracing::info!(v2 = "a\"b\n", x = f64::NAN, "q\"uote"),
            r#""msg":"q\"uote","v":0,"v2":"a\"b\n","x":"NaN"}"#,
        ),
    ];
    for (name, emit, want) in rows {
        let out = json(*emit);
        let line = out
            .strip_suffix('\n')
            .unwrap_or_else(|| panic!("{name}: {out:?}"));
        assert!(!line.contains('\n'), "{name}: one line: {line:?}");
        assert!(
            line.starts_with(r#"{"ts":1732740737695.837,"caller":"logging/klog_tests.rs:"#),
            "{name}: {line}"
        );
        assert!(line.ends_with(want), "{name}: {line}\nwant the end: {want}");
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {line}"));
        assert_eq!(v["ts"].as_f64(), Some(1732740737695.837), "{name}");
    }
}

/// What a pipeline built for kube-controller-manager's JSON reads, over every level and with or
/// without an error: `ts` a number of milliseconds, `caller` `dir/file:line`, `msg` the message,
/// `v` a verbosity exactly when the line is not an error, `err` the error.
#[test]
fn json_as_component_base_pipelines_read_it() {
    let out = json(|| {
        tracing::error!(error = %"e1", "a");
        tracing::error!("b");
        tracing::warn!(error = %"e2", "c");
        tracing::info!("d");
        tracing::debug!(k = 1, "e");
        tracing::trace!("f");
    });
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let want: [(&str, Option<u64>, Option<&str>); 6] = [
        ("a", None, Some("e1")),
        ("b", None, None),
        ("c", Some(0), Some("e2")),
        ("d", Some(0), None),
        ("e", Some(4), None),
        ("f", Some(5), None),
    ];
    assert_eq!(lines.len(), want.len(), "{out}");
    for (l, (msg, v, err)) in lines.iter().zip(want) {
        assert_eq!(l["msg"], msg, "{l}");
        assert_eq!(l.get("v").map(|v| v.as_u64().unwrap()), v, "{l}");
        assert_eq!(l.get("err").map(|e| e.as_str().unwrap()), err, "{l}");
        assert!(l["ts"].is_f64() || l["ts"].is_u64(), "{l}");
        let caller = l["caller"].as_str().unwrap();
        let (file, line) = caller.rsplit_once(':').unwrap();
        assert_eq!(file, "logging/klog_tests.rs", "{l}");
        assert!(line.parse::<u32>().is_ok(), "{l}");
        assert!(
            l.get("level").is_none() && l.get("message").is_none(),
            "{l}"
        );
    }
}

/// Go's %q over every character class: the quoted text has no raw control character and no
/// unescaped quote, and reads back as the original.
#[test]
fn go_quote_reads_back() {
    fn unquote(q: &str) -> String {
        let inner = &q[1..q.len() - 1];
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                assert!(c != '"' && !c.is_control(), "raw {c:?} in {q}");
                out.push(c);
                continue;
            }
            let esc = chars.next().unwrap();
            let hex = |n: usize, chars: &mut std::str::Chars| {
                let h: String = chars.take(n).collect();
                char::from_u32(u32::from_str_radix(&h, 16).unwrap()).unwrap()
            };
            out.push(match esc {
                'n' => '\n',
                'r' => '\r',
                't' => '\t',
                'a' => '\u{7}',
                'b' => '\u{8}',
                'f' => '\u{c}',
                'v' => '\u{b}',
                'x' => hex(2, &mut chars),
                'u' => hex(4, &mut chars),
                c => c,
            });
        }
        out
    }
    let samples = [
        String::new(),
        "plain".into(),
        "\"quoted\" \\ back".into(),
        "tab\tnl\ncr\r".into(),
        (0u32..0x20).filter_map(char::from_u32).collect::<String>(),
        "\u{7f}\u{85}\u{9f}é日本✓".into(),
    ];
    for s in samples {
        let mut q = String::new();
        go_quote(&s, &mut q);
        assert!(
            q.starts_with('"') && q.ends_with('"') && q.len() >= 2,
            "{q}"
        );
        assert_eq!(unquote(&q), s, "{q}");
    }
    let mut q = String::new();
    go_quote("a\u{1}é", &mut q);
    assert_eq!(q, "\"a\\x01é\"");
}

#[test]
fn verbosity_follows_kubernetes_conventions() {
    use tracing::Level;
    for (level, v) in [
        (Level::ERROR, None),
        (Level::WARN, Some(0)),
        (Level::INFO, Some(0)),
        (Level::DEBUG, Some(4)),
        (Level::TRACE, Some(5)),
    ] {
        assert_eq!(verbosity(&level), v, "{level}");
    }
}

/// A value from the cluster (an annotation, a pod name, an error from the apiserver) cannot
/// forge a log line: in text, every line a value adds starts with a tab or is klog's ` >`, never
/// with a severity letter; in JSON the line stays one object.
#[test]
fn hostile_values_cannot_forge_lines() {
    let forged = "x\nE1127 20:52:17.695837       1 apply.rs:1] \"force-deleted pod\"\n\r\u{1b}[2J";
    for value in [forged, "\n", "a\n\nb", "\u{2028}line separator", "\"] \"x"] {
        let out =
            text(|| tracing::warn!(annotation = value, error = %value, "malformed {}", value));
        let mut lines = out.lines();
        assert!(lines.next().is_some_and(|l| l.starts_with('W')), "{out:?}");
        for l in lines {
            assert!(
                l.starts_with('\t') || l == " >" || l.starts_with(" > "),
                "{value:?} forged {l:?} in {out:?}"
            );
        }
        assert!(!out.contains('\u{1b}') && !out.contains('\r'), "{out:?}");
        let out =
            json(|| tracing::warn!(annotation = value, error = %value, "malformed {}", value));
        assert_eq!(out.lines().count(), 1, "{out:?}");
        let v: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(v["annotation"], value);
        assert_eq!(v["err"], value);
        assert_eq!(v["msg"], format!("malformed {value}"));
    }
}

/// An object reference as component-base's JSON writes klog's `KObj`: a nested object, name
/// first, the namespace left out for a cluster-scoped object; klog's text keeps `"ns/name"`.
#[test]
fn object_references_nest_in_json_and_stay_ns_name_in_text() {
    let emit = || {
        tracing::info!(
            pod = KObj::new("ns", "p").field(),
            node = KObj::cluster("n1").field(),
            n = 1,
            "force-deleted pod"
        )
    };
    let out = json(emit);
    assert!(
        out.trim_end().ends_with(
            r#""msg":"force-deleted pod","v":0,"pod":{"name":"p","namespace":"ns"},"node":{"name":"n1"},"n":1}"#
        ),
        "{out}"
    );
    let v: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
    assert_eq!(
        v["pod"],
        serde_json::json!({"name": "p", "namespace": "ns"})
    );
    assert_eq!(v["node"], serde_json::json!({"name": "n1"}));
    assert!(v["node"].get("namespace").is_none(), "{out}");

    let line = text(emit);
    let body = line.split_once("] ").unwrap().1;
    assert_eq!(
        body, "\"force-deleted pod\" pod=\"ns/p\" node=\"n1\" n=1\n",
        "{line}"
    );
    // The same text as the `%"ns/p"` a reference was logged with before.
    let before = text(|| tracing::info!(pod = %"ns/p", node = "n1", n = 1, "force-deleted pod"));
    assert_eq!(body, before.split_once("] ").unwrap().1);
}

/// klog's `KRef("", name)` and `KObj(obj)`: an empty namespace is a cluster-scoped object, and
/// a Kubernetes object gives its own namespace and name.
#[test]
fn kobj_of_objects_and_empty_namespaces() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    let mut pod = Pod::default();
    pod.metadata.namespace = Some("ns".into());
    pod.metadata.name = Some("p".into());
    let mut node = Node::default();
    node.metadata.name = Some("n1".into());
    assert_eq!(KObj::of(&pod), KObj::new("ns", "p"));
    assert_eq!(KObj::of(&node), KObj::cluster("n1"));
    assert_eq!(KObj::new("", "n1"), KObj::cluster("n1"));
    assert_eq!(KObj::of(&pod).to_string(), "ns/p");
    assert_eq!(KObj::cluster("n1").to_string(), "n1");
    assert_eq!(KObj::cluster("n1").namespace(), None);
    let out = json(|| tracing::info!(node = KObj::new("", "n1").field(), "x"));
    assert!(out.contains(r#""node":{"name":"n1"}"#), "{out}");
}

/// A name from the cluster with quotes, line breaks, control characters or any Unicode keeps a
/// JSON line one valid object whose reference reads back exactly, and a text line unforged.
#[test]
fn hostile_object_names_stay_valid_json() {
    let hostile = [
        "a\"b",
        "line\nE1127 20:52:17.695837       1 x.rs:1] \"forged\"",
        "\\\"}, \"v\":9, \"x\":{\"",
        "\r\u{1b}[2J\u{0}",
        "日本\u{2028}✓",
    ];
    for name in hostile {
        let out = json(|| {
            tracing::error!(
                pod = KObj::new(name, name).field(),
                node = KObj::cluster(name).field(),
                "m"
            )
        });
        assert_eq!(out.lines().count(), 1, "{out:?}");
        let v: serde_json::Value = serde_json::from_str(out.trim_end())
            .unwrap_or_else(|e| panic!("{name:?}: not JSON ({e}): {out}"));
        assert_eq!(v["pod"]["name"], name);
        assert_eq!(v["pod"]["namespace"], name);
        assert_eq!(v["node"], serde_json::json!({ "name": name }));
        assert!(v.get("v").is_none(), "{out}");
        let line = text(|| tracing::warn!(pod = KObj::new(name, name).field(), "m"));
        for l in line.lines().skip(1) {
            assert!(
                l.starts_with('\t') || l.starts_with(" >"),
                "{name:?} forged {l:?}"
            );
        }
        assert!(!line.contains('\u{1b}') && !line.contains('\r'), "{line:?}");
    }
}
