//! One place for figures, one place for history, nothing outside the repository: a measured
//! figure (a time, a memory size) lives only in docs/benchmarks.md, beside the command that
//! takes it again, and every other file links there; only CHANGELOG.md says how the project
//! changed, while comments and docs say what is and why; and no file cites one outside the
//! repository (upstream's behaviour is summarised in docs/upstream.md). Limits, defaults and
//! protocol constants (`a timeout of 10 s`, `the chart's limit, 256 MiB`) are not figures.

use std::path::{Path, PathBuf};

use super::{assert_none, history::files_under, repo};

/// The only file measured figures live in.
const BENCHMARKS: &str = "docs/benchmarks.md";
/// The only file that narrates history.
const CHANGELOG: &str = "CHANGELOG.md";

/// Units of the figures this looks for (times under a second and memory sizes).
const UNITS: &[&str] = &["MiB", "MB", "GiB", "GB", "KiB", "ms", "µs"];
/// Words that make a figure near them a measurement.
const MEASURED: &[&str] = &[
    "measured", "was", "were", "peak", "steady", "p50", "p99", "took", "fell", "grew", "stayed",
];
/// Words that make a figure near them a limit, a goal or a bound, not a measurement.
const LIMITS: &[&str] = &["bound", "limit", "goal", "budget", "cap", "at most"];
/// How far (bytes) on either side of a figure those words are looked for.
const NEAR: usize = 30;

/// Lines the figure rule would take for measurements that are not, each with the reason: a
/// fragment of the line and the file it is in. An entry that matches no such line fails the
/// test, so the list only holds what it must.
const NOT_MEASURED: &[(&str, &str, &str)] = &[
    (
        "node-agent/benches/agent_scale.rs",
        "steady RSS under 32 MiB",
        "the bench's goals, which it prints each figure over",
    ),
    (
        "controllers/src/podgc/cache.rs",
        "is 4.5 MB of JSON",
        "arithmetic on a page size (500 pods of 9 KiB), the reason for the constant below it",
    ),
];

/// The byte offsets of each figure in `line`: a number (`12`, `27.8`) not inside a word or a
/// longer number, an optional space, and a unit of [`UNITS`] not followed by a letter or digit.
fn figures(line: &str) -> Vec<(usize, usize)> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = b[i].is_ascii_digit()
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || matches!(b[i - 1], b'.' | b'_')));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j + 1 < b.len() && b[j] == b'.' && b[j + 1].is_ascii_digit() {
            j += 1;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
        }
        let k = if b.get(j) == Some(&b' ') { j + 1 } else { j };
        let unit = UNITS.iter().find(|u| {
            line[k..].starts_with(**u)
                && line[k + u.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| !c.is_alphanumeric())
        });
        if let Some(u) = unit {
            out.push((i, k + u.len()));
        }
        i = j.max(i + 1);
    }
    out
}

/// Whether `word` (lower case, may hold a space) stands in `text` as a whole word.
fn has_word(text: &str, word: &str) -> bool {
    let t = text.to_lowercase();
    let mut from = 0;
    while let Some(at) = t[from..].find(word) {
        let (s, e) = (from + at, from + at + word.len());
        let before = t[..s]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_alphanumeric());
        let after = t[e..].chars().next().is_none_or(|c| !c.is_alphanumeric());
        if before && after {
            return true;
        }
        from = e;
    }
    false
}

/// The text within [`NEAR`] bytes of `start..end`, cut at character boundaries.
fn around(line: &str, start: usize, end: usize) -> &str {
    let mut s = start.saturating_sub(NEAR);
    while !line.is_char_boundary(s) {
        s -= 1;
    }
    let mut e = (end + NEAR).min(line.len());
    while !line.is_char_boundary(e) {
        e += 1;
    }
    &line[s..e]
}

/// A measured figure in `line`, if any: a figure with a word of [`MEASURED`] near it and none
/// of [`LIMITS`].
fn measured(line: &str) -> bool {
    figures(line).into_iter().any(|(s, e)| {
        let near = around(line, s, e);
        MEASURED.iter().any(|w| has_word(near, w)) && !LIMITS.iter().any(|w| has_word(near, w))
    })
}

/// What a line says of how the code evolved, if anything.
fn narration(line: &str) -> bool {
    let lower = line.to_lowercase();
    let phrases = [
        "an earlier version",
        "earlier versions",
        "before this was fixed",
    ];
    if phrases.iter().any(|p| lower.contains(p)) || lower.trim_start().starts_with("mod legacy") {
        return true;
    }
    // "it used to do" and "used to be" narrate; "the label used to select pods" and "is used
    // to" do not.
    let mut from = 0;
    while let Some(at) = lower[from..].find("used to ") {
        let s = from + at;
        let prev = lower[..s].split_whitespace().next_back().unwrap_or("");
        let next = lower[s + 8..].split_whitespace().next().unwrap_or("");
        let subject = ["it", "we", "they", "this", "that", "which", "who", "there"];
        let be = next.trim_end_matches(|c: char| !c.is_alphanumeric()) == "be";
        if subject.contains(&prev) || be {
            return true;
        }
        from = s + 1;
    }
    false
}

/// Whether a line cites a file outside the repository. The path is built from parts, so that
/// this file does not hold it.
fn outside(line: &str) -> bool {
    line.contains(&["..", "/shared", "/spec"].concat())
}

/// Every line of `files` (relative to `root`) that breaks a rule, with the rule.
fn offenders(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    for path in files {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        if rel.starts_with("charts/testdata/") || rel == "testkit/tests/layout/figures.rs" {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            let allowed = NOT_MEASURED
                .iter()
                .any(|(p, fragment, _)| *p == rel && line.contains(fragment));
            let what = if rel != BENCHMARKS && measured(line) && !allowed {
                "a measured figure: it lives in docs/benchmarks.md, with its command; link there"
            } else if rel != CHANGELOG && narration(line) {
                "history: say what is and why (the CHANGELOG says what changed)"
            } else if outside(line) {
                "a file outside the repository: say what it says in docs/ (docs/upstream.md)"
            } else {
                continue;
            };
            out.push(format!("{rel}:{}: {what}: {}", i + 1, line.trim()));
        }
    }
    out
}

#[test]
fn figures_in_benchmarks_history_in_the_changelog_nothing_outside() {
    let files = files_under(&repo());
    for must in [
        CHANGELOG,
        BENCHMARKS,
        "docs/conntrack.md",
        "charts/groundskeeper/values.yaml",
    ] {
        assert!(
            files.iter().any(|p| p.ends_with(must)),
            "the scan does not read {must}: it would pass by reading nothing"
        );
    }
    assert_none(
        "figures outside docs/benchmarks.md, history outside CHANGELOG.md, or files outside the \
         repository (a limit or default near a measured word can be named in NOT_MEASURED)",
        offenders(&repo(), &files),
    );
    let stale: Vec<String> = NOT_MEASURED
        .iter()
        .filter(|(p, fragment, _)| {
            let text = std::fs::read_to_string(repo().join(p)).unwrap_or_default();
            !text.lines().any(|l| l.contains(fragment) && measured(l))
        })
        .map(|(p, fragment, _)| format!("{p}: {fragment:?}: no such line, drop it"))
        .collect();
    assert_none("stale NOT_MEASURED entries", stale);
    assert!(NOT_MEASURED.iter().all(|(_, _, why)| why.len() > 20));
}

/// The whole scan on a planted tree: the bad lines are found where they are not allowed, and
/// the same lines pass where they are (a figure in docs/benchmarks.md, history in the
/// CHANGELOG), so the check can fail and does not fail on everything.
#[test]
fn the_scan_finds_planted_lines() {
    let root = std::env::temp_dir().join(format!("gk-layout-figures-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let spec = format!(
        "see `{}` section 3\n",
        ["..", "/shared", "/spec/UPSTREAM.md"].concat()
    );
    let plant = [
        (BENCHMARKS, "| RSS steady | 27.8 MiB |\n"),
        ("docs/x.md", "the agent was measured at 27.8 MiB steady\n"),
        (
            CHANGELOG,
            "- It used to patch pods.\n- holds 27.8 MiB steady (was 34.7 MiB)\n",
        ),
        (
            "src/a.rs",
            "// an earlier version applied status\nmod legacy {\n",
        ),
        ("docs/y.md", spec.as_str()),
        (
            "docs/ok.md",
            "a timeout of 10 s, the chart's limit 256 MiB, a duration such as 500ms; \
             the label is used to select pods\n",
        ),
    ];
    for (p, text) in plant {
        let path = root.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    let found: Vec<String> = offenders(&root, &files_under(&root))
        .into_iter()
        .map(|o| o.split(": ").next().unwrap().to_string())
        .collect();
    std::fs::remove_dir_all(&root).unwrap();
    let mut found = found;
    found.sort();
    assert_eq!(
        found,
        [
            "CHANGELOG.md:2",
            "docs/x.md:1",
            "docs/y.md:1",
            "src/a.rs:1",
            "src/a.rs:2"
        ],
    );
}

#[test]
fn what_counts_as_a_measured_figure() {
    for (line, caught) in [
        ("it holds 27.8 MiB steady (was 34.7)", true),
        ("CPU per change 1.15 ms at 10k Services (was 1.35).", true),
        ("peak RSS was 34.7 MiB during the flood", true),
        ("p50 -1.5 ms, p99 +0.2 ms", true),
        ("the first list's peak fell from 41.6 to 27.8 MiB", true),
        ("took 64 ms and a UDP dump 143 ms", true),
        ("the chart's limit is 256 MiB, the peak far under it", false),
        ("legitimate reviews' p99 beside its bound (100 ms)", false),
        ("a duration such as 500ms, a timeout of 10 s", false),
        (
            "requests: {cpu: 20m, memory: 32Mi}, limits: {memory: 256Mi}",
            false,
        ),
        ("no body over 16 KiB (413, unread)", false),
        ("etcd stores no object over 1.5 MiB; 3 MiB + 64 KiB", false),
        (
            "the figures: docs/benchmarks.md#podgcs-cache-per-pod",
            false,
        ),
    ] {
        assert_eq!(measured(line), caught, "{line}");
    }
}

#[test]
fn what_counts_as_history() {
    for (line, caught) in [
        ("It used to patch a pod that had not started", true),
        ("(an earlier version applied status under its name)", true),
        (
            "earlier versions applied under kube-controller-manager's name",
            true,
        ),
        ("/// (seen under load before this was fixed).", true),
        ("mod legacy {", true),
        ("the label is used to select the pods", false),
        ("which used to be the default", true),
        ("the string used to identify the lease", false),
        ("a pod that no longer exists", false),
        (
            "the reference model the compact index is checked against",
            false,
        ),
    ] {
        assert_eq!(narration(line), caught, "{line}");
    }
}
