//! Docs that cannot drift: every `## Code` map in docs/ names only files and items that exist,
//! every product file of a component appears in its component's map, and the files the data
//! paths of docs/architecture.md walk through exist.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{COMPONENTS, WINGS, assert_none, repo};

/// The folders whose every product file a `## Code` map must name: the components, the
/// folders of the wings' other rooms, the sysctl rules both binaries judge by, and the kubectl
/// plugin.
fn mapped() -> Vec<String> {
    let mut dirs: Vec<String> = COMPONENTS.iter().map(|c| c.to_string()).collect();
    for (wing, rooms) in WINGS {
        for room in rooms.iter().filter_map(|r| r.strip_suffix('/')) {
            let dir = format!("{wing}/{room}");
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs.push("sysctl-rules/src".into());
    dirs.push("controllers/src/plugin".into());
    dirs
}

/// One `## Code` section of a docs page: the page, its text, and the folders it maps, each
/// with the part of the text under it (from the line that names the folder, `` `dir/` ``, to
/// the next such line).
struct Map {
    page: String,
    text: String,
    dirs: Vec<(String, String)>,
}

fn docs() -> Vec<(String, String)> {
    let mut pages: Vec<_> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    pages
        .into_iter()
        .map(|p| {
            let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, text)
        })
        .collect()
}

/// The folder a line opens a map of: a line starting with `` `some/src/dir/` ``.
fn folder_heading(line: &str) -> Option<String> {
    let rest = line.strip_prefix('`')?;
    let (token, _) = rest.split_once('`')?;
    let dir = token.strip_suffix('/')?;
    (dir.contains("/src") && !dir.contains(' ')).then(|| dir.to_string())
}

fn code_maps(pages: &[(String, String)]) -> Vec<Map> {
    let mut maps = Vec::new();
    for (page, text) in pages {
        let mut in_map = false;
        let mut map = Map {
            page: page.clone(),
            text: String::new(),
            dirs: Vec::new(),
        };
        for line in text.lines() {
            if line.starts_with("## ") {
                if in_map {
                    maps.push(std::mem::replace(
                        &mut map,
                        Map {
                            page: page.clone(),
                            text: String::new(),
                            dirs: Vec::new(),
                        },
                    ));
                }
                in_map = line.trim() == "## Code";
                continue;
            }
            if !in_map {
                continue;
            }
            map.text.push_str(line);
            map.text.push('\n');
            if let Some(dir) = folder_heading(line) {
                map.dirs.push((dir, String::new()));
            }
            if let Some((_, under)) = map.dirs.last_mut() {
                under.push_str(line);
                under.push('\n');
            }
        }
        if in_map {
            maps.push(map);
        }
    }
    maps
}

/// Every `` `…` `` span of a text.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// A span that names a file or folder: `a.rs`, `a/b.rs`, `a.rs::item`, `dir/`.
fn file_part(token: &str) -> Option<&str> {
    if token.contains(' ') {
        return None;
    }
    let file = token.split("::").next().unwrap_or(token);
    (file.ends_with(".rs") || (file.ends_with('/') && file.len() > 1)).then_some(file)
}

/// A span that names a Rust item: `name`, `Type::item`, `a::b::C`, `f()`.
fn item_path(token: &str) -> Option<Vec<&str>> {
    let t = token.strip_suffix("()").unwrap_or(token);
    let segs: Vec<&str> = t.split("::").collect();
    let ident = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    segs.iter().all(|s| ident(s)).then_some(segs)
}

/// Every `.rs` file under `dir` (recursively).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let p = e.expect("directory entry").path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The words of Rust code, comments left out: what an item name in a map must be among.
fn code_words(files: &[PathBuf]) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for line in text.lines() {
            let code = match line.find("//") {
                Some(i) => &line[..i],
                None => line,
            };
            for w in code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if !w.is_empty() {
                    words.insert(w.to_string());
                }
            }
        }
    }
    words
}

/// The project's code, less these checks (whose own examples name items that do not exist).
fn all_code() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for krate in [
        "plumbing",
        "sysctl-rules",
        "controllers",
        "node-agent",
        "testkit",
    ] {
        for part in ["src", "tests", "benches"] {
            files.extend(rust_files(&repo().join(krate).join(part)));
        }
    }
    files.retain(|p| !p.starts_with(repo().join("testkit/tests/layout")));
    files
}

/// The files a name in a map may stand for: from one of the bases, or anywhere below one (a
/// map names `socket.rs` inside its `netlink/` line, a component's tests by their file name).
fn locate(file: &str, bases: &[PathBuf], below: &[PathBuf]) -> Vec<PathBuf> {
    let file = file.trim_start_matches("../");
    let direct: Vec<PathBuf> = bases
        .iter()
        .map(|b| b.join(file))
        .filter(|p| p.exists())
        .collect();
    if !direct.is_empty() {
        return direct;
    }
    let tail = format!("/{}", file.trim_end_matches('/'));
    below
        .iter()
        .filter(|p| {
            let p = p.display().to_string();
            p.ends_with(&tail) || p.contains(&format!("{tail}/"))
        })
        .cloned()
        .collect()
}

fn resolves(file: &str, bases: &[PathBuf]) -> bool {
    let below: Vec<PathBuf> = bases.iter().flat_map(|b| rust_files(b)).collect();
    !locate(file, bases, &below).is_empty()
}

/// The repository's root, the map's folders, and for each its crate's `src/` and `tests/`.
fn bases_of(map: &Map) -> Vec<PathBuf> {
    let mut bases = vec![repo()];
    bases.extend(map.dirs.iter().map(|(dir, _)| repo().join(dir)));
    for (dir, _) in &map.dirs {
        let krate = dir.split("/src").next().unwrap_or(dir);
        bases.push(repo().join(krate).join("src"));
        bases.push(repo().join(krate).join("tests"));
    }
    bases
}

/// What a map's spans name that does not exist: a file in no folder of the map, an item
/// (`read_stale`, `Type::gone`) in no code, an item after `file.rs::` not in that file.
fn dangling(map: &Map, words: &BTreeSet<String>) -> Vec<String> {
    let bases = bases_of(map);
    let below: Vec<PathBuf> = bases[1..].iter().flat_map(|b| rust_files(b)).collect();
    let mut out = Vec::new();
    for token in backticked(&map.text) {
        if let Some(file) = file_part(&token) {
            let found = locate(file, &bases, &below);
            if found.is_empty() {
                out.push(format!("{}: `{token}`: no such file", map.page));
                continue;
            }
            if let Some((_, item)) = token.split_once("::") {
                let in_file = code_words(&found);
                if !in_file.contains(item) {
                    out.push(format!("{}: `{token}`: no `{item}` in {file}", map.page));
                }
            }
        } else if let Some(segs) = item_path(&token) {
            let last = segs.last().expect("a segment");
            // lowerCamelCase is Go's (upstream's `canDeleteCIDR`), never a Rust item of ours.
            let go = last.starts_with(|c: char| c.is_ascii_lowercase())
                && last.contains(|c: char| c.is_ascii_uppercase());
            if !go && !words.contains(*last) {
                out.push(format!("{}: `{token}`: named in no code", map.page));
            }
        }
    }
    out
}

/// The product files of a mapped folder (relative to it) that its map's part never names.
fn unmapped(dir: &str, under: &str) -> Vec<String> {
    let named: BTreeSet<String> = backticked(under)
        .iter()
        .filter_map(|t| file_part(t))
        .map(str::to_string)
        .collect();
    let root = repo().join(dir);
    rust_files(&root)
        .into_iter()
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .filter(|rel| !super::is_test_file(rel))
        .filter(|rel| {
            let base = rel.rsplit('/').next().unwrap_or(rel);
            !named
                .iter()
                .any(|n| n == rel || n == base || n.ends_with(&format!("/{rel}")))
        })
        .map(|rel| format!("{dir}/{rel}"))
        .collect()
}

#[test]
fn code_maps_name_only_what_exists() {
    let words = code_words(&all_code());
    let maps = code_maps(&docs());
    assert!(
        maps.len() >= 4,
        "found only {} `## Code` maps in docs/",
        maps.len()
    );
    let offenders = maps.iter().flat_map(|m| dangling(m, &words)).collect();
    assert_none(
        "`## Code` maps naming files or items that do not exist (fix the map)",
        offenders,
    );
}

#[test]
fn every_product_file_is_in_its_components_map() {
    let maps = code_maps(&docs());
    let mut offenders = Vec::new();
    for dir in mapped() {
        let parts: Vec<&String> = maps
            .iter()
            .flat_map(|m| m.dirs.iter())
            .filter(|(d, _)| *d == dir)
            .map(|(_, under)| under)
            .collect();
        if parts.is_empty() {
            offenders.push(format!(
                "{dir}/: no `## Code` map in docs/ opens with `{dir}/`"
            ));
            continue;
        }
        let under: String = parts.into_iter().cloned().collect();
        offenders.extend(unmapped(&dir, &under));
    }
    assert_none(
        "product files missing from their component's `## Code` map (add a line for each)",
        offenders,
    );
}

/// The data paths of docs/architecture.md name files relative to a crate's `src/` (or its
/// `tests/`); each must exist somewhere there.
#[test]
fn the_data_paths_walk_through_files_that_exist() {
    let text =
        std::fs::read_to_string(repo().join("docs/architecture.md")).expect("architecture.md");
    let mut bases = vec![repo()];
    for krate in [
        "plumbing",
        "sysctl-rules",
        "controllers",
        "node-agent",
        "testkit",
    ] {
        bases.push(repo().join(krate).join("src"));
        bases.push(repo().join(krate).join("tests"));
    }
    for c in mapped() {
        bases.push(repo().join(c));
    }
    bases.push(repo().join("node-agent/src/conntrack/netlink"));
    let mut offenders = Vec::new();
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || "_/.-".contains(c))) {
        let word = word.trim_end_matches('.');
        // `*_tests.rs`, `<file>_tests.rs`: a pattern, not a file.
        let pattern = word.starts_with('_') || word.starts_with('-');
        if word.ends_with(".rs") && !pattern && !resolves(word, &bases) {
            offenders.push(format!("docs/architecture.md: {word}"));
        }
    }
    let found: BTreeSet<String> = offenders.into_iter().collect();
    assert_none(
        "files named in docs/architecture.md that do not exist",
        found.into_iter().collect(),
    );
}

/// The checks see what they are meant to: a made-up map with a missing file, a missing item
/// and an unmapped file is caught on each count.
#[test]
fn a_drifted_map_is_caught() {
    let page = "## Code\n\n`node-agent/src/conntrack/`:\n\n* `pass.rs`: `read_stale`, `run_focused_pass`.\n* `gone.rs`: nothing.\n* `decide.rs::stale`, `decide.rs::tally_deletes`.\n\n## Next\n";
    let maps = code_maps(&[("docs/x.md".into(), page.into())]);
    assert_eq!(maps.len(), 1);
    let words = code_words(&all_code());
    let found = dangling(&maps[0], &words);
    for want in ["`read_stale`", "`gone.rs`", "`decide.rs::tally_deletes`"] {
        assert!(
            found.iter().any(|f| f.contains(want)),
            "{want} not caught: {found:?}"
        );
    }
    assert!(
        !found
            .iter()
            .any(|f| f.contains("run_focused_pass") || f.contains("::stale`")),
        "an existing item reported: {found:?}"
    );
    let missing = unmapped("node-agent/src/conntrack", &maps[0].dirs[0].1);
    assert!(
        missing.iter().any(|m| m.ends_with("/sweep.rs")),
        "sweep.rs not reported as unmapped: {missing:?}"
    );
    assert!(!missing.iter().any(|m| m.ends_with("/pass.rs")));
}
