//! The shape docs/architecture.md describes, checked on the source tree so that it does not
//! drift: every component of its table checked here, the rooms of a wing, one watch primitive,
//! the same files in every component, no import of a binary's
//! wiring from a component, no file over 600 lines (product code, benches, testkit), e2e/cluster.sh
//! under 400 (its parts in e2e/cluster/, each sourced), a `//!` line opening every file,
//! sibling test files declared without `#[path]`, one dry-run log style, decisions that name no
//! wire type, no import circle between the modules of a crate nor the rooms of a component.

use std::path::{Path, PathBuf};

/// The components, each with the files every component has: every row of the component table
/// of docs/architecture.md (`## The components`), and no other.
const COMPONENTS: &[&str] = &[
    "controllers/src/servicecidr",
    "controllers/src/podgc",
    "controllers/src/sysctl/webhook",
    "controllers/src/sysctl/placement",
    "node-agent/src/conntrack",
    "node-agent/src/sysctlreport",
];
const SHAPE: &[&str] = &["mod.rs", "decide.rs", "apply.rs", "cache.rs", "metrics.rs"];
/// The wings: a folder of components that share rooms, with every room in it (a file, or a
/// folder ending in `/`) besides its `mod.rs`. A component of a wing has the wing's `cache.rs`
/// (one set of watches per process for all of them), not one of its own.
const WINGS: &[(&str, &[&str])] = &[(
    "controllers/src/sysctl",
    &["cache.rs", "facts.rs", "tls/", "webhook/", "placement/"],
)];
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
    for krate in [
        "plumbing",
        "sysctl-rules",
        "controllers",
        "node-agent",
        "testkit",
    ] {
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

/// Fails naming every source file for which `breaks(path, text)` says what rule it breaks.
fn check(rule: &str, breaks: impl Fn(&str, &str) -> Option<String>) {
    let offenders = sources()
        .into_iter()
        .filter_map(|(path, text)| breaks(&path, &text).map(|why| format!("{path}{why}")))
        .collect();
    assert_none(rule, offenders);
}

/// The wing `component` is in, if any.
fn wing_of(component: &str) -> Option<&'static str> {
    WINGS.iter().map(|(wing, _)| *wing).find(|wing| {
        component
            .strip_prefix(wing)
            .is_some_and(|r| r.starts_with('/'))
    })
}

/// A component's own file, or for `cache.rs` its wing's (`sysctl/cache.rs` for
/// `sysctl/webhook` and `sysctl/placement`).
fn has_file(component: &str, file: &str) -> bool {
    match wing_of(component) {
        Some(wing) if file == "cache.rs" => repo().join(wing).join(file).is_file(),
        _ => repo().join(component).join(file).is_file(),
    }
}

/// The folders of the rows of the component table of an architecture page: the second
/// column's `` `folder/` `` in the `## The components` section.
fn table_components(page: &str) -> Vec<String> {
    let mut in_table = false;
    let mut out = Vec::new();
    for line in page.lines() {
        if line.starts_with("## ") {
            in_table = line.trim() == "## The components";
            continue;
        }
        let folder = line
            .split('|')
            .nth(2)
            .and_then(|cell| cell.trim().strip_prefix('`'))
            .and_then(|cell| cell.split('`').next())
            .and_then(|folder| folder.strip_suffix('/'));
        if let Some(folder) = folder.filter(|f| in_table && f.contains("/src/")) {
            out.push(folder.to_string());
        }
    }
    out
}

/// Every component docs/architecture.md tables is checked here, and every one checked here is
/// in its table: a new component cannot be left out of either; the wings' rooms are named
/// there too.
#[test]
fn every_component_in_the_architecture_table_is_checked() {
    let page =
        std::fs::read_to_string(repo().join("docs/architecture.md")).expect("architecture.md");
    let tabled = table_components(&page);
    let mut offenders: Vec<String> = tabled
        .iter()
        .filter(|c| !COMPONENTS.contains(&c.as_str()))
        .map(|c| format!("{c}: in the table, not in COMPONENTS"))
        .collect();
    offenders.extend(
        COMPONENTS
            .iter()
            .filter(|c| !tabled.iter().any(|t| t == *c))
            .map(|c| format!("{c}: in COMPONENTS, not in the table")),
    );
    let section = page
        .split("## The components")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap_or_default();
    for (wing, rooms) in WINGS {
        for room in *rooms {
            let named = [format!("`{room}`"), format!("`{wing}/{room}`")];
            if !named.iter().any(|n| section.contains(n.as_str())) {
                offenders.push(format!("{wing}/{room}: a room not named in the section"));
            }
        }
    }
    assert_none(
        "docs/architecture.md's component table and the layout test's lists disagree",
        offenders,
    );
    let made_up = "## The components\n\n| component | folder | binary |\n|---|---|---|\n\
        | new | `controllers/src/new/` | controller-manager |\n\n## Next\n\n| x | `controllers/src/podgc/` |\n";
    assert_eq!(
        table_components(made_up),
        ["controllers/src/new"],
        "a row of the table, and only the table"
    );
}

/// A wing holds its rooms and nothing else, and each of its components is one of them.
#[test]
fn every_wing_holds_its_rooms() {
    let mut offenders = Vec::new();
    for (wing, rooms) in WINGS {
        let dir = repo().join(wing);
        let mut found: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{wing}: {e}"))
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.is_dir() || p.extension().is_some_and(|x| x == "rs"))
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                if p.is_dir() { format!("{name}/") } else { name }
            })
            .filter(|n| n != "mod.rs" && !is_test_file(n))
            .collect();
        found.sort();
        let mut want: Vec<String> = rooms.iter().map(|r| r.to_string()).collect();
        want.sort();
        if found != want {
            offenders.push(format!("{wing}: holds {found:?}, WINGS lists {want:?}"));
        }
        for c in COMPONENTS.iter().filter(|c| wing_of(c) == Some(*wing)) {
            let room = format!("{}/", c.strip_prefix(wing).unwrap().trim_start_matches('/'));
            if !rooms.contains(&room.as_str()) {
                offenders.push(format!("{c}: a component of {wing} not among its rooms"));
            }
        }
    }
    assert_none("wings whose rooms differ from WINGS", offenders);
}

#[test]
fn every_component_has_the_same_files() {
    let mut missing = Vec::new();
    for c in COMPONENTS {
        for f in SHAPE {
            if !has_file(c, f) {
                missing.push(format!("{c}/{f}"));
            }
        }
    }
    assert_none(
        "component files missing (see docs/architecture.md)",
        missing,
    );
}

/// The pure decisions judge plain values: a component's `decide.rs` is handed the fields it
/// judges (conntrack's a `Flow`), never a wire type, so it is read and tested without the
/// kernel's ABI.
#[test]
fn decisions_name_no_wire_type() {
    let offenders = COMPONENTS
        .iter()
        .map(|c| format!("{c}/decide.rs"))
        .filter(|f| {
            let text = std::fs::read_to_string(repo().join(f)).unwrap_or_default();
            text.contains("netlink::")
        })
        .collect();
    assert_none(
        "decide.rs files naming netlink (hand them the fields they judge)",
        offenders,
    );
}

#[test]
fn only_plumbing_watches() {
    check(
        "a watch outside plumbing::watch::cache (use Watches::follow)",
        |path, text| {
            let needles = [
                "watcher(",
                "watcher::watcher",
                "reflector",
                "watch_store",
                "stream::watch(",
            ];
            let found: Vec<&str> = needles.into_iter().filter(|n| text.contains(n)).collect();
            (!path.starts_with("plumbing/") && !found.is_empty()).then(|| format!(": {found:?}"))
        },
    );
}

#[test]
fn components_depend_on_their_context_not_the_wiring() {
    check(
        "a component imports the binary's wiring (an import cycle)",
        |path, text| {
            let wiring = text.contains("crate::manager") || text.contains("crate::agent");
            (COMPONENTS.iter().any(|c| path.starts_with(c)) && wiring).then(String::new)
        },
    );
}

/// Files allowed past [`MAX_LINES`], each with the reason it is still one file. An entry
/// whose file is gone or back under the limit fails the test, so the list only shrinks.
const LONG_FILES: &[(&str, &str)] = &[(
    "testkit/src/control_plane.rs",
    "one process tree started, restarted, frozen and torn down together (etcd, the \
         apiserver, their PKI and kubeconfigs); the PKI writing could still leave it",
)];

/// The code the line limit covers: every crate's product files (`src/`, less the sibling
/// `*_tests.rs` files), its benches, and all of testkit (its `src/` and its `tests/`).
fn limited_files() -> Vec<(String, usize)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let p = e.expect("directory entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    for krate in [
        "plumbing",
        "sysctl-rules",
        "controllers",
        "node-agent",
        "testkit",
    ] {
        walk(&repo().join(krate).join("src"), &mut files);
        walk(&repo().join(krate).join("benches"), &mut files);
    }
    walk(&repo().join("testkit/tests"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(repo()).unwrap().display().to_string();
            let lines = std::fs::read_to_string(&p)
                .unwrap_or_default()
                .lines()
                .count();
            (rel, lines)
        })
        .filter(|(rel, _)| !is_test_file(rel) || rel.starts_with("testkit/"))
        .collect()
}

#[test]
fn no_file_over_600_lines() {
    let files = limited_files();
    let offenders = files
        .iter()
        .filter(|(path, lines)| *lines > MAX_LINES && !LONG_FILES.iter().any(|(p, _)| p == path))
        .map(|(path, lines)| format!("{path}: {lines} lines"))
        .collect();
    assert_none(
        "files over 600 lines (split by domain or by row, move tests to <file>_tests.rs, or name \
         the file in LONG_FILES with the reason it is one file)",
        offenders,
    );
    let stale = LONG_FILES
        .iter()
        .filter(|(p, _)| !files.iter().any(|(f, n)| f == p && *n > MAX_LINES))
        .map(|(p, _)| format!("{p}: gone or under the limit, drop it from LONG_FILES"))
        .collect();
    assert_none("stale LONG_FILES entries", stale);
    assert!(
        LONG_FILES.iter().all(|(_, why)| why.len() > 20),
        "every LONG_FILES entry says why"
    );
}

/// What ships: the crates' `src/` (less the sibling `*_tests.rs` and testkit) stays under a
/// tighter limit than the rest, so a file is split by meaning long before it is at the cap.
const MAX_PRODUCT_LINES: usize = 550;

#[test]
fn no_product_file_over_550_lines() {
    let offenders = limited_files()
        .into_iter()
        .filter(|(path, lines)| {
            *lines > MAX_PRODUCT_LINES
                && path.contains("/src/")
                && !path.starts_with("testkit/")
                && !is_test_file(path)
        })
        .map(|(path, lines)| format!("{path}: {lines} lines"))
        .collect();
    assert_none(
        "product files over 550 lines (split them by meaning)",
        offenders,
    );
}

/// e2e/cluster.sh is the entry point (its usage, the sourcing of its parts, the dispatcher); what
/// the cluster does lives in the parts, e2e/cluster/*.sh, each sourced by it.
const CLUSTER_SH_MAX_LINES: usize = 400;

#[test]
fn the_cluster_entry_point_stays_short_and_sources_every_part() {
    let text = std::fs::read_to_string(repo().join("e2e/cluster.sh")).expect("e2e/cluster.sh");
    let lines = text.lines().count();
    assert!(
        lines < CLUSTER_SH_MAX_LINES,
        "e2e/cluster.sh: {lines} lines, {CLUSTER_SH_MAX_LINES} or more (put the code in a part of \
         e2e/cluster/)"
    );
    let mut parts: Vec<String> = std::fs::read_dir(repo().join("e2e/cluster"))
        .expect("e2e/cluster/")
        .map(|e| {
            e.expect("directory entry")
                .file_name()
                .to_string_lossy()
                .to_string()
        })
        .filter(|name| name.ends_with(".sh"))
        .collect();
    parts.sort();
    assert!(!parts.is_empty(), "no part in e2e/cluster/");
    let offenders = parts
        .into_iter()
        .filter(|name| !text.contains(&format!(". \"$here/cluster/{name}\"")))
        .map(|name| format!("e2e/cluster/{name}"))
        .collect();
    assert_none("parts e2e/cluster.sh does not source", offenders);
}

#[test]
fn every_file_says_what_it_is_for() {
    check("files not opening with a one-line `//!`", |_, text| {
        (!text.starts_with("//! ")).then(String::new)
    });
}

#[test]
fn sibling_test_files_are_declared_not_pathed() {
    check(
        "#[path] module declarations (declare <file>_tests.rs from the parent)",
        |_, text| text.contains("#[path").then(String::new),
    );
}

#[test]
fn one_dry_run_log_style() {
    check(
        "dry-run lines not written as `dry-run: would …`",
        |_, text| {
            let old = text.contains("\"dry run") || text.contains("dry_run = true, \"would");
            old.then(String::new)
        },
    );
}

mod circles;
mod code_maps;
mod figures;
mod glossary;
mod history;
mod life;
mod skips;
