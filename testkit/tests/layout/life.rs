//! One runner for a component's life (`plumbing::life`): every component's loop is in its
//! `worker.rs`, and no component spawns, joins or gates its own tasks.

use super::{COMPONENTS, assert_none, is_test_file, repo, sources};

/// The components whose work is not a loop of their own: the webhook answers requests, and
/// its loop is the HTTP server's (`plumbing::serving`); what it runs beside it is the
/// certificate's worker (`sysctl/tls/worker.rs`).
const SERVERS: &[&str] = &["controllers/src/sysctl/webhook"];

/// The component code that wires a life by hand, if `text` has any: a spawned or joined task,
/// or the leadership gate waited on. `plumbing::life` does these, once. (A blocking call on a
/// thread of its own, conntrack's netlink thread, is no life: it is a tool.)
fn wires_its_own_life(text: &str) -> Option<&'static str> {
    // What a file's own tests do is theirs.
    let product = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    [
        "tokio::spawn(",
        "JoinSet",
        "tokio::task::JoinHandle",
        ".acquired()",
    ]
    .into_iter()
    .find(|needle| product.contains(needle))
}

#[test]
fn every_components_loop_is_in_its_worker_rs() {
    let missing = COMPONENTS
        .iter()
        .filter(|c| !SERVERS.contains(c))
        .chain(&["controllers/src/sysctl/tls"])
        .filter(|c| !repo().join(c).join("worker.rs").is_file())
        .map(|c| format!("{c}/worker.rs"))
        .collect();
    assert_none(
        "a component's loop not in its worker.rs (see docs/architecture.md)",
        missing,
    );
}

#[test]
fn no_component_wires_its_own_life() {
    let offenders = sources()
        .into_iter()
        .filter(|(path, _)| {
            COMPONENTS
                .iter()
                .chain(&["controllers/src/sysctl/tls"])
                .any(|c| path.starts_with(&format!("{c}/")))
                && !is_test_file(path)
        })
        .filter_map(|(path, text)| wires_its_own_life(&text).map(|n| format!("{path}: {n}")))
        .collect();
    assert_none(
        "a component wiring its own start, leadership wait or drain (hand it to plumbing::life)",
        offenders,
    );
}

#[test]
fn the_rule_sees_a_hand_wired_life() {
    for planted in [
        "let feeder = tokio::spawn(async move {});",
        "let mut workers = JoinSet::new();",
        "ctx.leadership.acquired().await;",
    ] {
        assert!(wires_its_own_life(planted).is_some(), "{planted}");
    }
    let in_tests =
        "fn run() {}\n#[cfg(test)]\nmod tests {\n    fn t() { tokio::spawn(async {}); }\n}\n";
    assert_eq!(wires_its_own_life(in_tests), None);
    assert_eq!(
        wires_its_own_life("life.run(listed.wait(), start).await"),
        None
    );
}
