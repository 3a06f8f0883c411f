//! The shape docs/architecture.md describes, checked on the source tree so that it does not
//! drift: one watch primitive, the same files in every component, no import of a binary's
//! wiring from a component, no product file over 600 lines, a `//!` line opening every file,
//! sibling test files declared without `#[path]`, one dry-run log style.

use std::path::{Path, PathBuf};

/// The four components, each with the files every component has.
const COMPONENTS: &[&str] = &[
    "controllers/src/servicecidr",
    "controllers/src/podgc",
    "node-agent/src/conntrack",
    "node-agent/src/sysctl",
];
const SHAPE: &[&str] = &["mod.rs", "decide.rs", "apply.rs", "cache.rs", "metrics.rs"];
const MAX_LINES: usize = 600;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under the crates' `src/`, with its path relative to the repository.
fn sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.expect("directory entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    for krate in ["plumbing", "controllers", "node-agent", "testkit"] {
        walk(&repo().join(krate).join("src"), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(repo())
                .expect("under the repository")
                .display()
                .to_string();
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{rel}: {e}"));
            (rel, text)
        })
        .collect()
}

fn is_test_file(path: &str) -> bool {
    path.ends_with("_tests.rs")
}

fn assert_none(what: &str, offenders: Vec<String>) {
    assert!(
        offenders.is_empty(),
        "{what}:\n  {}",
        offenders.join("\n  ")
    );
}

#[test]
fn every_component_has_the_same_files() {
    let mut missing = Vec::new();
    for c in COMPONENTS {
        for f in SHAPE {
            if !repo().join(c).join(f).is_file() {
                missing.push(format!("{c}/{f}"));
            }
        }
    }
    assert_none(
        "component files missing (see docs/architecture.md)",
        missing,
    );
}

#[test]
fn only_plumbing_watches() {
    let offenders = sources()
        .into_iter()
        .filter(|(path, _)| !path.starts_with("plumbing/"))
        .flat_map(|(path, text)| {
            [
                "watcher(",
                "watcher::watcher",
                "reflector",
                "watch_store",
                "watch::watch(",
            ]
            .into_iter()
            .filter(|needle| text.contains(needle))
            .map(|needle| format!("{path}: {needle}"))
            .collect::<Vec<_>>()
        })
        .collect();
    assert_none(
        "a watch outside plumbing::cache (use Watches::follow)",
        offenders,
    );
}

#[test]
fn components_depend_on_their_context_not_the_wiring() {
    let offenders = sources()
        .into_iter()
        .filter(|(path, _)| COMPONENTS.iter().any(|c| path.starts_with(c)))
        .filter(|(_, text)| text.contains("crate::manager") || text.contains("crate::agent"))
        .map(|(path, _)| path)
        .collect();
    assert_none(
        "a component imports the binary's wiring (an import cycle)",
        offenders,
    );
}

#[test]
fn no_product_file_over_600_lines() {
    let offenders = sources()
        .into_iter()
        .filter(|(path, _)| !is_test_file(path) && !path.starts_with("testkit/"))
        .filter_map(|(path, text)| {
            let lines = text.lines().count();
            (lines > MAX_LINES).then(|| format!("{path}: {lines} lines"))
        })
        .collect();
    assert_none(
        "product files over 600 lines (split by domain, or move tests to <file>_tests.rs)",
        offenders,
    );
}

#[test]
fn every_file_says_what_it_is_for() {
    let offenders = sources()
        .into_iter()
        .filter(|(_, text)| !text.starts_with("//! "))
        .map(|(path, _)| path)
        .collect();
    assert_none("files not opening with a one-line `//!`", offenders);
}

#[test]
fn sibling_test_files_are_declared_not_pathed() {
    let offenders = sources()
        .into_iter()
        .filter(|(_, text)| text.contains("#[path"))
        .map(|(path, _)| path)
        .collect();
    assert_none(
        "#[path] module declarations (declare <file>_tests.rs from the parent)",
        offenders,
    );
}

#[test]
fn one_dry_run_log_style() {
    let offenders = sources()
        .into_iter()
        .filter(|(_, text)| text.contains("\"dry run") || text.contains("dry_run = true, \"would"))
        .map(|(path, _)| path)
        .collect();
    assert_none("dry-run lines not written as `dry-run: would …`", offenders);
}
