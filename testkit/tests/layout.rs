//! The shape docs/architecture.md describes, checked on the source tree so that it does not
//! drift: one watch primitive, the same files in every component, no import of a binary's
//! wiring from a component, no product file over 600 lines, a `//!` line opening every file,
//! sibling test files declared without `#[path]`, one dry-run log style, no import circle
//! between the modules of a crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The components, each with the files every component has.
const COMPONENTS: &[&str] = &[
    "controllers/src/servicecidr",
    "controllers/src/podgc",
    "controllers/src/sysctlwebhook",
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
    for krate in ["plumbing", "sysctl", "controllers", "node-agent", "testkit"] {
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
    check(
        "a watch outside plumbing::cache (use Watches::follow)",
        |path, text| {
            let needles = [
                "watcher(",
                "watcher::watcher",
                "reflector",
                "watch_store",
                "watch::watch(",
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

#[test]
fn no_product_file_over_600_lines() {
    check(
        "product files over 600 lines (split by domain, or move tests to <file>_tests.rs)",
        |path, text| {
            let lines = text.lines().count();
            let product = !is_test_file(path) && !path.starts_with("testkit/");
            (product && lines > MAX_LINES).then(|| format!(": {lines} lines"))
        },
    );
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

/// A crate's modules (`a::b`, the root is ``), each with the modules its product code names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module a source file is, within its crate: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`,
/// `src/lib.rs` the root. `None` for what is not part of the library's module tree (binaries,
/// sibling test files).
fn module_of(path_in_src: &str) -> Option<String> {
    let p = path_in_src.strip_suffix(".rs")?;
    if p == "main" || p.starts_with("bin/") || is_test_file(path_in_src) {
        return None;
    }
    if p == "lib" {
        return Some(String::new());
    }
    let p = p.strip_suffix("/mod").unwrap_or(p);
    Some(p.replace('/', "::"))
}

/// The text the module's product code is made of: comments and the inline `#[cfg(test)]`
/// modules (which by this house's rule close a file) removed.
fn product_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]")
            && lines.peek().is_some_and(|n| {
                let n = n.trim_start();
                (n.starts_with("mod ") || n.starts_with("pub mod ")) && n.ends_with('{')
            })
        {
            break;
        }
        let code = match t.find("//") {
            Some(i) if !t[..i].contains('"') => &t[..i],
            _ => t,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The paths a `use` tree names, each written out whole (`a::{b, c::{d as e}}` gives `a::b`,
/// `a::c::d`; `a::{self}` gives `a`).
fn expand_use(prefix: &str, tree: &str) -> Vec<String> {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = &tree[..open];
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut items = Vec::new();
        let (mut depth, mut start) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&inner[start..]);
        return items
            .into_iter()
            .filter(|i| !i.trim().is_empty())
            .flat_map(|i| expand_use(&format!("{prefix}{head}"), i))
            .collect();
    }
    let item = tree.split(" as ").next().unwrap_or(tree).trim();
    let path = format!("{prefix}{item}");
    vec![path.strip_suffix("::self").unwrap_or(&path).to_string()]
}

/// Every path in `code` that may name a module of this crate: the `use` trees written out,
/// and the `crate::`, `super::`, `self::` and `child::` paths in the code.
fn paths_in(code: &str, children: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + 4..];
        let Some(end) = after.find(';') else { break };
        if before.is_none_or(|c| !c.is_alphanumeric() && c != '_') {
            out.extend(expand_use("", &after[..end].replace(['\n', ' '], " ")));
            rest = &after[end..];
        } else {
            rest = after;
        }
    }
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let starts =
            (i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == ':')) && is_ident(bytes[i]);
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (is_ident(bytes[j]) || bytes[j] == ':') {
            j += 1;
        }
        let path: String = bytes[i..j].iter().collect();
        let first = path.split("::").next().unwrap_or("");
        if path.contains("::")
            && (["crate", "super", "self"].contains(&first) || children.contains(first))
        {
            out.push(path.trim_end_matches(':').to_string());
        }
        i = j;
    }
    out
}

/// The module of this crate `path`, written in module `from`, names (the longest known
/// prefix), or `None` for a path into another crate or the standard library.
fn resolve(from: &str, path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut at: Vec<&str> = from.split("::").filter(|s| !s.is_empty()).collect();
    let mut segs = path.split("::").filter(|s| !s.is_empty()).peekable();
    match segs.peek().copied() {
        Some("crate") => {
            at.clear();
            segs.next();
        }
        Some("self") => {
            segs.next();
        }
        Some("super") => {
            while segs.peek() == Some(&"super") {
                segs.next();
                at.pop()?;
            }
        }
        Some(first) if modules.contains(&join(&at, first)) => {}
        _ => return None,
    }
    for seg in segs {
        let next = join(&at, seg);
        if !modules.contains(&next) {
            break;
        }
        at.push(seg);
    }
    Some(at.join("::"))
}

/// Whether module `m` is `ancestor` or inside it.
fn is_within(m: &str, ancestor: &str) -> bool {
    ancestor.is_empty() || m == ancestor || m.starts_with(&format!("{ancestor}::"))
}

fn join(at: &[&str], seg: &str) -> String {
    if at.is_empty() {
        seg.to_string()
    } else {
        format!("{}::{seg}", at.join("::"))
    }
}

/// The module graph of one crate from its files (`path in src/` -> text).
fn module_graph<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Graph {
    let files: Vec<(String, &str)> = files
        .into_iter()
        .filter_map(|(p, t)| module_of(p).map(|m| (m, t)))
        .collect();
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = Graph::new();
    for (m, text) in &files {
        let prefix = if m.is_empty() {
            String::new()
        } else {
            format!("{m}::")
        };
        let children: BTreeSet<String> = modules
            .iter()
            .filter_map(|c| c.strip_prefix(&prefix))
            .filter(|c| !c.is_empty() && !c.contains("::"))
            .map(str::to_string)
            .collect();
        let edges = graph.entry(m.clone()).or_default();
        for path in paths_in(&product_code(text), &children) {
            // A module is inside its ancestors: naming their items (a component's Args, the
            // crate root's helpers) is no circle. Circles are between modules neither of which
            // contains the other.
            if let Some(to) = resolve(m, &path, &modules)
                && to != *m
                && !is_within(m, &to)
            {
                edges.insert(to);
            }
        }
    }
    graph
}

/// The circles of `graph`: each strongly connected set of two or more modules (Tarjan), named.
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut set = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    set.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    self.found.push(set);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found.sort();
    walk.found
}

#[test]
fn no_import_circle_between_modules() {
    let mut by_crate: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (path, text) in sources() {
        let (krate, in_src) = path.split_once("/src/").expect("a crate's src/");
        by_crate
            .entry(krate.to_string())
            .or_default()
            .push((in_src.to_string(), text));
    }
    let mut found = Vec::new();
    for (krate, files) in &by_crate {
        let graph = module_graph(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
        for circle in circles(&graph) {
            found.push(format!("{krate}: {}", circle.join(" <-> ")));
        }
    }
    assert_none(
        "modules that import each other, directly or around a circle (move what both need \
         into one of them, or below both)",
        found,
    );
}

/// A made-up crate: its name, its files (path in `src/`, text), the circles it must show.
type SyntheticCrate = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [&'static [&'static str]],
);

/// The check itself, on made-up crates: it must see a circle however the imports are written,
/// and must not see one where there is none.
#[test]
fn a_synthetic_module_circle_is_found() {
    let cases: &[SyntheticCrate] = &[
        (
            "two siblings through super::",
            &[
                ("lib.rs", "pub mod a;\npub mod b;\n"),
                ("a.rs", "//! a\nuse super::b::Thing;\n"),
                ("b.rs", "//! b\nuse super::{a::Other, c};\n"),
            ],
            &[&["a", "b"]],
        ),
        (
            "three around through crate:: and a path in code",
            &[
                ("lib.rs", "pub mod x;\n"),
                ("x/mod.rs", "pub mod p;\npub mod q;\npub mod r;\n"),
                ("x/p.rs", "use crate::x::q::Q;\n"),
                ("x/q.rs", "fn f() { let _ = super::r::R::new(); }\n"),
                ("x/r.rs", "use crate::{\n    x::{p::{self, P}},\n};\n"),
            ],
            &[&["x::p", "x::q", "x::r"]],
        ),
        (
            "through a parent that names its children without a prefix",
            &[
                ("lib.rs", "pub mod m;\n"),
                ("m/mod.rs", "pub mod j;\npub mod k;\nfn f() { k::run(); }\n"),
                ("m/j.rs", "use super::{Args, k::K};\n"),
                (
                    "m/k.rs",
                    "use super::Args;\nfn g() { super::j::J::new(); }\n",
                ),
            ],
            &[&["m::j", "m::k"]],
        ),
        (
            "imports one way only, tests, comments and a child naming its parent aside",
            &[
                ("lib.rs", "pub mod a;\npub mod b;\n"),
                (
                    "a.rs",
                    "use super::b::B;\n// use super::a::A in a comment\n",
                ),
                ("a/deep.rs", "use crate::a::A;\nuse super::super::b;\n"),
                (
                    "b.rs",
                    "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
                ),
                ("b_tests.rs", "use super::a::*;\n"),
                ("main.rs", "use demo::a;\n"),
            ],
            &[],
        ),
    ];
    for (name, files, want) in cases {
        let got = circles(&module_graph(files.iter().copied()));
        let want: Vec<Vec<String>> = want
            .iter()
            .map(|c| c.iter().map(|m| m.to_string()).collect())
            .collect();
        assert_eq!(got, want, "{name}");
    }
}
