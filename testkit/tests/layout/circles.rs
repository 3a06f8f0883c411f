//! No import circle between the modules of a crate, nor between the rooms of a component (the
//! files and folders directly in its folder): each crate's module graph, read off the product
//! code, and its circles.

use std::collections::{BTreeMap, BTreeSet};

use super::{assert_none, is_test_file, sources};

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

/// The rooms of each component (`conntrack::model`, `conntrack::cache`: what sits directly in
/// the component's folder, a file or a folder), each with the rooms its modules import.
fn room_graph(graph: &Graph) -> Graph {
    let room = |m: &str| -> String { m.split("::").take(2).collect::<Vec<_>>().join("::") };
    let mut rooms = Graph::new();
    for (m, edges) in graph {
        let from = room(m);
        let out = rooms.entry(from.clone()).or_default();
        out.extend(edges.iter().map(|e| room(e)).filter(|to| {
            // The component's own mod.rs wires its rooms: it is above them all.
            *to != from && !is_within(&from, to)
        }));
    }
    rooms
}

/// A change walks down a component's rooms and never back: the rooms import each other one
/// way only (a room's own files may import each other, within the module rule above).
#[test]
fn no_import_circle_between_the_rooms_of_a_component() {
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
        for circle in circles(&room_graph(&graph)) {
            found.push(format!("{krate}: {}", circle.join(" <-> ")));
        }
    }
    assert_none(
        "rooms of a component that import each other (a walk from a watch event to a write \
         would go back into a room it left)",
        found,
    );
    let synthetic = module_graph([
        ("lib.rs", "pub mod c;\n"),
        ("c/mod.rs", "pub mod m;\npub mod s;\n"),
        ("c/m/mod.rs", "pub mod a;\npub mod b;\n"),
        ("c/m/a.rs", "use crate::c::s::S;\n"),
        ("c/m/b.rs", "pub struct B;\n"),
        ("c/s.rs", "use super::m::b::B;\n"),
    ]);
    assert!(circles(&synthetic).is_empty(), "no module circle");
    assert_eq!(
        circles(&room_graph(&synthetic)),
        vec![vec!["c::m".to_string(), "c::s".to_string()]],
        "a circle through two files of one room is a circle between rooms"
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
