//! The repository speaks only of the project: no absolute path of a developer's machine (the
//! checkout, a shared folder, a lock file) and no "issue NN" in code, scripts or docs, where a
//! comment says the reason itself. An upstream issue or pull request (`kubernetes#139629`) may
//! be named: it is where the reader finds upstream's reasoning.

use std::path::{Path, PathBuf};

use super::{assert_none, repo};

/// The text files the project is made of, outside build output and git's own folder.
fn project_files() -> Vec<PathBuf> {
    files_under(&repo())
}

/// The text files under `root`, outside build output and git's own folder.
pub(super) fn files_under(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let p = e.expect("directory entry").path();
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if p.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | ".tools" | "node_modules") {
                    walk(&p, out);
                }
            } else if [
                ".rs", ".md", ".sh", ".py", ".yaml", ".yml", ".toml", ".tpl", ".txt", ".json",
            ]
            .iter()
            .any(|x| name.ends_with(x))
                || matches!(name.as_str(), "Makefile" | "Dockerfile" | "run")
            {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(root, &mut files);
    files.sort();
    files
}

/// What a line says of a machine or of the project's history, if anything.
// The patterns are built from parts, so that this file holds no path of a machine itself.
fn history(line: &str) -> Option<&'static str> {
    if line.contains(&["/", "work", "/"].concat()) {
        return Some("an absolute path of a developer's machine");
    }
    if line.contains(&["bench", ".lock"].concat()) {
        return Some("a developer's lock file");
    }
    let lower = line.to_ascii_lowercase();
    let upstream = lower.contains("kubernetes#") || lower.contains("kubernetes/kubernetes");
    let mut rest = lower.as_str();
    while let Some(i) = rest.find("issue") {
        let after = rest[i + 5..].trim_start_matches([' ', '-', '#']);
        if !upstream && after.starts_with(|c: char| c.is_ascii_digit()) {
            return Some("an issue number: say the reason itself");
        }
        rest = &rest[i + 5..];
    }
    None
}

#[test]
fn no_machine_paths_and_no_issue_numbers() {
    let this = repo().join("testkit/tests/layout/history.rs");
    let mut offenders = Vec::new();
    for path in project_files().into_iter().filter(|p| *p != this) {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let rel = path.strip_prefix(repo()).unwrap().display().to_string();
        for (i, line) in text.lines().enumerate() {
            if let Some(what) = history(line) {
                offenders.push(format!("{rel}:{}: {what}: {}", i + 1, line.trim()));
            }
        }
    }
    assert_none(
        "history or machine paths in the repository (comments say why, docs say what is)",
        offenders,
    );
}

#[test]
fn what_counts_as_history() {
    for (line, caught) in [
        ("// Item 9 of issue 21: a Retry-After", true),
        ("# Issue 22's chart items", true),
        ("(issue #24)", true),
        ("see issue-26's relists", true),
        (
            &*format!("KUBE_APISERVER=/{}/shared/bin/kube-apiserver", "work"),
            true,
        ),
        (&*format!("flock notes/bench{} cargo bench", ".lock"), true),
        ("as upstream does (kubernetes#139629)", false),
        ("kubernetes/kubernetes issue 1234 explains it", false),
        ("a pod with an issue: no number here", false),
        ("KUBE_APISERVER=path/to/kube-apiserver", false),
    ] {
        assert_eq!(history(line).is_some(), caught, "{line}");
    }
}
