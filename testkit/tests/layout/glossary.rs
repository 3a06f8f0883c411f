//! One word per concept (docs/architecture.md, `## Glossary`): at most one `struct Cache` per
//! wing or component, one object key type (no `(namespace, name)` pair of strings beside it),
//! and no function named `judge`, whose four meanings have names of their own.

use std::collections::BTreeMap;

use super::{COMPONENTS, WINGS, assert_none, check, sources};

/// The wing or component a source file belongs to, else its own folder.
fn home(path: &str) -> String {
    let under = |dir: &str| path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'));
    WINGS
        .iter()
        .map(|(wing, _)| *wing)
        .chain(COMPONENTS.iter().copied())
        .find(|dir| under(dir))
        .map_or_else(
            || path.rsplit_once('/').map_or("", |(dir, _)| dir).to_string(),
            str::to_string,
        )
}

/// How often `text` defines an item `kind name` (`struct Cache`, not `struct Caches`).
fn defines(text: &str, kind: &str, name: &str) -> usize {
    let item = format!("{kind} {name}");
    text.match_indices(&item)
        .filter(|(i, _)| {
            let before = text[..*i].chars().next_back();
            let after = text[i + item.len()..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .count()
}

/// The homes holding more than one `struct Cache`, with their files.
fn caches_per_home(files: &[(String, String)]) -> Vec<String> {
    let mut homes: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (path, text) in files {
        for _ in 0..defines(text, "struct", "Cache") {
            homes.entry(home(path)).or_default().push(path);
        }
    }
    homes
        .into_iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|(home, files)| format!("{home}/: {}", files.join(", ")))
        .collect()
}

/// The names of the type aliases in `text` for a pair of strings (`type Key = (String,
/// String);`): a `(namespace, name)` key beside `plumbing::ObjectKey`.
fn string_pairs(text: &str) -> Vec<&str> {
    text.match_indices("type ")
        .filter(|(i, _)| {
            !text[..*i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .filter_map(|(i, item)| {
            let rest = &text[i + item.len()..];
            let (name, aliased) = rest[..rest.find(';')?].split_once('=')?;
            let aliased: String = aliased.split_whitespace().collect();
            let pair = [
                "(String,String)",
                "(Box<str>,Box<str>)",
                "(Arc<str>,Arc<str>)",
            ];
            pair.contains(&aliased.as_str()).then(|| name.trim())
        })
        .collect()
}

/// Every definition of an object key type but the one: `PodKey` anywhere, `ObjectKey`
/// anywhere but `plumbing/src/key.rs` (and missing there), an alias for a pair of strings
/// anywhere.
fn keys_defined(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut home = 0;
    for (path, text) in files {
        // `PodKey` and `ObjectKey` are named below, whatever they alias.
        for name in string_pairs(text)
            .into_iter()
            .filter(|n| !["PodKey", "ObjectKey"].contains(n))
        {
            out.push(format!(
                "{path}: type {name}, a pair of strings (use plumbing::ObjectKey)"
            ));
        }
        for kind in ["struct", "type", "enum"] {
            for _ in 0..defines(text, kind, "PodKey") {
                out.push(format!("{path}: {kind} PodKey (use plumbing::ObjectKey)"));
            }
            let n = defines(text, kind, "ObjectKey");
            if path == "plumbing/src/key.rs" && kind == "struct" {
                home += n;
            } else if n > 0 {
                out.push(format!(
                    "{path}: {kind} ObjectKey (one, in plumbing/src/key.rs)"
                ));
            }
        }
    }
    if home != 1 {
        out.push(format!(
            "plumbing/src/key.rs: {home} `struct ObjectKey`, not one"
        ));
    }
    out
}

fn names_judge(text: &str) -> bool {
    ["fn judge(", "fn judge<"].iter().any(|f| text.contains(f))
}

#[test]
fn at_most_one_struct_cache_per_wing() {
    assert_none(
        "wings or components with more than one `struct Cache` (name each from what it holds)",
        caches_per_home(&sources()),
    );
}

#[test]
fn the_object_key_is_defined_once() {
    assert_none(
        "object key types besides plumbing::ObjectKey",
        keys_defined(&sources()),
    );
}

#[test]
fn no_function_is_named_judge() {
    check(
        "functions named `judge` (name what they do: verdict, from_reported, staleness_in, review ...)",
        |_, text| names_judge(text).then(|| ": fn judge".to_string()),
    );
}

/// The checks see what they are meant to, on made-up files.
#[test]
fn a_drifted_glossary_is_caught() {
    let file = |p: &str, t: &str| (p.to_string(), t.to_string());
    let two = [
        file("controllers/src/sysctl/cache.rs", "pub struct Cache {}"),
        file("controllers/src/sysctl/tls/cache.rs", "struct Cache;"),
        file("controllers/src/podgc/cache.rs", "pub struct Caches {}"),
        file(
            "controllers/src/servicecidr/cache.rs",
            "pub struct Cache {}",
        ),
    ];
    let found = caches_per_home(&two);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("controllers/src/sysctl/:"),
        "{found:?}"
    );

    let keys = [
        file("plumbing/src/key.rs", "pub struct ObjectKey(Arc<str>);"),
        file(
            "controllers/src/sysctl/facts.rs",
            "pub type PodKey = (String, String);",
        ),
        file("node-agent/src/x.rs", "struct PodKeys;"),
        file(
            "node-agent/src/conntrack/model/source.rs",
            "/// Namespace and name.\npub type Key = (String, String);\npub type ViewsOf<V> = Store<Key, V>;",
        ),
        file(
            "node-agent/src/conntrack/pass/sweep.rs",
            "pub type UnseenKey = (SocketAddr, SocketAddr);\nfn subtype() {}",
        ),
    ];
    let found = keys_defined(&keys);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("sysctl/facts.rs"), "{found:?}");
    assert!(found[1].contains("model/source.rs: type Key,"), "{found:?}");
    assert!(
        !keys_defined(&keys[1..]).is_empty(),
        "a missing ObjectKey not caught"
    );

    assert!(names_judge("    pub fn judge(&self) {}"));
    assert!(names_judge("pub fn judge<'a>(x: &'a str) {}"));
    assert!(!names_judge("fn judged_by_its_version() {}"));
}
