//! Loud skips: a test whose environment is missing says `SKIPPED`, and under `CI=true` fails,
//! so that a change to CI can never quietly skip every cluster test. Every Rust test skips
//! through `testkit::skipped`, every check script through a `skip` that fails under CI.

use super::{assert_none, repo};

/// Lines that print a skip of their own instead of going through the one that fails under CI.
fn own_skips(path: &str, text: &str, allowed: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim_start();
            !t.starts_with("//")
                && !t.starts_with('#')
                && t.contains("SKIPPED")
                && !t.contains(allowed)
        })
        .map(|(i, l)| format!("{path}:{}: {}", i + 1, l.trim()))
        .collect()
}

fn files_under(dir: &str, ext: &str) -> Vec<(String, String)> {
    fn walk(p: &std::path::Path, ext: &str, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(p) else {
            return;
        };
        for e in entries {
            let p = e.expect("directory entry").path();
            if p.is_dir() && !p.ends_with("target") && !p.ends_with(".git") {
                walk(&p, ext, out);
            } else if p.extension().is_some_and(|x| x == ext) {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join(dir), ext, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(repo()).unwrap().display().to_string();
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            (rel, text)
        })
        .collect()
}

/// Rust tests (not the benches, which are run by hand and print which comparison rows they
/// could not take) skip only through `testkit::skipped`.
#[test]
fn rust_tests_skip_through_testkit() {
    let mut offenders = Vec::new();
    for krate in [
        "plumbing",
        "sysctl-rules",
        "controllers",
        "node-agent",
        "testkit",
    ] {
        for part in ["src", "tests"] {
            for (path, text) in files_under(&format!("{krate}/{part}"), "rs") {
                let exempt = path == "testkit/src/lib.rs"
                    || path.starts_with("testkit/tests/layout/")
                    || path == "testkit/src/chart.rs";
                if !exempt {
                    offenders.extend(own_skips(&path, &text, "\u{0}"));
                }
            }
        }
    }
    assert_none(
        "tests printing their own SKIPPED line (call testkit::skipped: it fails under CI=true)",
        offenders,
    );
}

/// Check scripts (charts/, hack/, .ci/) skip only through a `skip` function that fails under
/// `CI=true`. e2e/ is checked by its own suite.
#[test]
fn check_scripts_skip_through_a_function_that_fails_under_ci() {
    let mut offenders = Vec::new();
    for dir in ["charts", "hack", ".ci"] {
        for (path, text) in files_under(dir, "sh") {
            let defines = text.contains("skip() { if [ \"${CI:-}\" = true ]");
            let lines = own_skips(&path, &text, "skip() {");
            if !lines.is_empty() && !defines {
                offenders.push(format!(
                    "{path}: prints SKIPPED with no skip() that fails under CI=true"
                ));
            }
            offenders.extend(lines.into_iter().filter(|l| l.contains("echo \"SKIPPED")));
        }
    }
    assert_none(
        "check scripts with a skip that passes under CI=true",
        offenders,
    );
}

#[test]
fn ci_values_that_make_a_skip_fail() {
    for (value, fails) in [
        (None, false),
        (Some(""), false),
        (Some("false"), false),
        (Some("0"), false),
        (Some("true"), true),
        (Some("TRUE"), true),
        (Some("1"), true),
        (Some(" true\n"), true),
    ] {
        assert_eq!(testkit::skips_fail(value), fails, "CI={value:?}");
    }
}

/// The child run by `a_skip_fails_under_ci_and_passes_loudly_without` (with
/// `GK_SKIP_CHILD=1`); in the suite's own run it has nothing to do. Not `#[ignore]`: under CI
/// no test of the suite may show as skipped either.
#[test]
fn skipping_test() {
    if std::env::var_os("GK_SKIP_CHILD").is_some() {
        testkit::skipped("skipping_test", "its environment is missing on purpose");
    }
}

#[test]
fn a_skip_fails_under_ci_and_passes_loudly_without() {
    let run = |ci: Option<&str>| {
        let mut cmd =
            std::process::Command::new(std::env::current_exe().expect("this test binary"));
        cmd.args(["--exact", "skips::skipping_test", "--nocapture"])
            .env("GK_SKIP_CHILD", "1");
        match ci {
            Some(v) => cmd.env("CI", v),
            None => cmd.env_remove("CI"),
        };
        let out = cmd.output().expect("run the test binary");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = run(None);
    assert!(ok, "without CI a skip passes: {text}");
    assert!(
        text.contains("SKIPPED skipping_test"),
        "the skip is not said: {text}"
    );
    assert!(
        text.contains("1 passed"),
        "the skipping test did not run: {text}"
    );
    let (ok, text) = run(Some("true"));
    assert!(!ok, "under CI=true a skip passed: {text}");
    assert!(text.contains("under CI=true a skip is a failure"), "{text}");
}
