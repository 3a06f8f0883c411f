//! `kubectl-groundskeeper` without a cluster: usage errors, help, and input refused before any
//! API call (the kubeconfig points at a port nothing listens on, so a call would say so).

use std::process::Output;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-groundskeeper");

fn run(args: &[&str], kubeconfig: &std::path::Path) -> Output {
    std::process::Command::new(BIN)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("running kubectl-groundskeeper")
}

/// A kubeconfig for a server that is not there.
fn nowhere() -> std::path::PathBuf {
    let path =
        std::env::temp_dir().join(format!("gk-plugin-cli-{}.kubeconfig", std::process::id()));
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster: {server: 'https://127.0.0.1:1'}\ncontexts:\n- name: c\n  context: {cluster: k, user: u, namespace: team-a}\nusers:\n- name: u\n  user: {token: t}\n",
    )
    .unwrap();
    path
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn usage_errors_exit_1_and_help_exits_0() {
    let kc = nowhere();
    for args in [
        &["why"][..],
        &["why", "pod"],
        &["why", "pod", "p", "-o", "xml"],
        &["why", "pod", "p", "--terminated-pod-ttl", "1 week"],
        &["sysctl", "check", "--node", "n"],
        &[
            "sysctl",
            "check",
            "-f",
            "x",
            "--node",
            "n",
            "--allowed-unsafe-sysctls",
            "vm.swappiness",
        ],
        &["frobnicate"],
        &["get", "servicecidrs", "--as-group", "g"],
    ] {
        let out = run(args, &kc);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
    for args in [&["--help"][..], &["why", "pod", "--help"], &["--version"]] {
        let out = run(args, &kc);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn a_bad_manifest_is_refused_before_any_api_call() {
    let kc = nowhere();
    let dir = std::env::temp_dir().join(format!("gk-plugin-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "kind: Pod\nspec: {securityContext: {sysctls: 7}}\n").unwrap();
    let empty = dir.join("empty.yaml");
    std::fs::write(&empty, "kind: ConfigMap\n").unwrap();
    let missing = dir.join("missing.yaml");
    for (file, want) in [
        (&bad, "pod spec does not parse"),
        (&empty, "no Pod or workload"),
        (&missing, "reading"),
    ] {
        let f = file.to_string_lossy();
        let out = run(&["sysctl", "check", "-f", &f, "--node", "n"], &kc);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{f}: {err}");
        assert!(err.contains(want), "{f}: {err}");
        assert!(!err.contains("127.0.0.1"), "{f}: it called the API: {err}");
    }
    // A good one reaches the API, and its failure is an error too.
    let good = dir.join("good.yaml");
    std::fs::write(
        &good,
        "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n",
    )
    .unwrap();
    let out = run(
        &[
            "sysctl",
            "check",
            "-f",
            &good.to_string_lossy(),
            "--node",
            "n",
            "--request-timeout",
            "5s",
        ],
        &kc,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_context_is_an_error_naming_it() {
    let kc = nowhere();
    let out = run(
        &[
            "--kubeconfig",
            &kc.to_string_lossy(),
            "--context",
            "gk-no-such-context",
            "why",
            "servicecidr",
            "x",
        ],
        &kc,
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("gk-no-such-context"), "{err}");
}

#[test]
fn help_says_kubectl_groundskeeper_and_completion_needs_no_cluster() {
    let kc = nowhere();
    let out = run(&["--help"], &kc);
    assert!(
        text(&out.stdout).contains("Usage: kubectl groundskeeper"),
        "{}",
        text(&out.stdout)
    );
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&["completion", shell], &kc);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("kubectl-groundskeeper"),
            "{shell}"
        );
    }
    // kubectl's plugin completion, through the helper beside the binary.
    let helper = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../hack/kubectl_complete-groundskeeper"
    );
    let dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(helper)
        .args(["why", "p"])
        .env("PATH", path)
        .output()
        .expect("running kubectl_complete-groundskeeper");
    assert_eq!(text(&out.stdout), "pod\n:4\n", "{}", text(&out.stderr));
}
