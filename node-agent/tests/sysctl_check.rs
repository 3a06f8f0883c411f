//! `node-agent sysctl check` as an admin runs it: the built binary, a manifest, stdout and the
//! exit code.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn check(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .args(["sysctl", "check"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start node-agent");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

const MANIFEST: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: safe}
spec:
  securityContext:
    sysctls:
    - {name: net.ipv4.tcp_keepalive_time, value: "600"}
  containers: [{name: c, image: busybox}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  template:
    spec:
      securityContext:
        sysctls:
        - {name: kernel/shm_rmid_forced, value: "1"}
        - {name: kernel.msgmax, value: "65536"}
      containers: [{name: c, image: postgres}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  template:
    spec:
      hostIPC: true
      securityContext:
        sysctls: [{name: kernel.shm_rmid_forced, value: "1"}]
      containers: [{name: c, image: x}]
"#;

#[test]
fn rejections_are_printed_per_pod_with_exit_1() {
    let o = check(&["--kernel-version", "5.4.0", "-f", "-"], MANIFEST);
    assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(&o));
    assert_eq!(
        stdout(&o),
        concat!(
            "Pod/safe: admit\n",
            "StatefulSet/db: reject: SysctlForbidden: forbidden sysctl: \"kernel.msgmax\" not allowlisted\n",
            "DaemonSet/agent: reject: SysctlForbidden: forbidden sysctl: \"kernel.shm_rmid_forced\" not allowed with host IPC enabled\n",
        )
    );
}

#[test]
fn kernel_version_gates_the_safe_list() {
    let o = check(&["--kernel-version", "4.4.0-210-generic"], MANIFEST);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).starts_with(
            "Pod/safe: reject: SysctlForbidden: forbidden sysctl: \"net.ipv4.tcp_keepalive_time\" not allowlisted\n"
        ),
        "{}",
        stdout(&o)
    );
}

#[test]
fn allowed_patterns_admit_with_exit_0() {
    let pods = MANIFEST
        .split("---")
        .take(2)
        .collect::<Vec<_>>()
        .join("---");
    let o = check(
        &[
            "--kernel-version",
            "6.1.0-18-amd64",
            "--allow",
            "kernel.msg*",
        ],
        &pods,
    );
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o), "Pod/safe: admit\nStatefulSet/db: admit\n");
}

#[test]
fn manifest_from_a_file() {
    let path = std::env::temp_dir().join(format!("sysctl-check-{}.yaml", std::process::id()));
    std::fs::write(&path, MANIFEST).unwrap();
    let o = check(
        &["--kernel-version", "5.4.0", "-f", path.to_str().unwrap()],
        "",
    );
    std::fs::remove_file(&path).unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stdout(&o).lines().count(), 3);
}

#[test]
fn bad_input_is_named_with_exit_2() {
    let cases: [(&[&str], &str, &str); 5] = [
        (&["--kernel-version", "five"], "", r#""five""#),
        (
            &["--kernel-version", "5.4", "--allow", "kernel.foo*"],
            "",
            r#"the sysctls "kernel.foo" are not known to be namespaced"#,
        ),
        (
            &["--kernel-version", "5.4", "--allow", "a*b"],
            "",
            r#"sysctl "a*b" must have at most 253 characters"#,
        ),
        (
            &["--kernel-version", "5.4"],
            "kind: Pod\n---\n[unclosed\n",
            "document 2",
        ),
        (
            &["--kernel-version", "5.4", "-f", "/nonexistent/pods.yaml"],
            "",
            "/nonexistent/pods.yaml",
        ),
    ];
    for (args, input, needle) in cases {
        let o = check(args, input);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?}: {}", stdout(&o));
    }
}

/// `--kubelet-version` checks as that kubelet: its safe list, its namespace table, the nearest
/// known version (said on stderr) outside v1.33 to v1.38, and garbage refused.
#[test]
fn kubelet_version_picks_the_rules() {
    const LOWAT: &str = "kind: Pod\nmetadata: {name: lowat}\nspec:\n  securityContext:\n    \
                         sysctls: [{name: net.ipv4.tcp_notsent_lowat, value: '16384'}]\n";
    let run = |extra: &[&str]| {
        let mut args = vec!["--kernel-version", "6.1.0-18-amd64"];
        args.extend(extra);
        check(&args, LOWAT)
    };
    for (extra, code, out) in [
        (
            &[][..],
            1,
            "Pod/lowat: reject: SysctlForbidden: forbidden sysctl: \"net.ipv4.tcp_notsent_lowat\" not allowlisted\n",
        ),
        (
            &["--kubelet-version", "v1.36.2"][..],
            1,
            "Pod/lowat: reject",
        ),
        (
            &["--kubelet-version", "v1.37.0-eks-4d1a2b"][..],
            0,
            "Pod/lowat: admit\n",
        ),
        (
            &["--kubelet-version", "v1.40.0"][..],
            0,
            "Pod/lowat: admit\n",
        ),
        (
            &[
                "--kubelet-version",
                "v1.37.0",
                "--allow",
                "kernel.domainname",
            ][..],
            0,
            "Pod/lowat: admit\n",
        ),
    ] {
        let o = run(extra);
        assert_eq!(o.status.code(), Some(code), "{extra:?}: {}", stderr(&o));
        assert!(stdout(&o).starts_with(out), "{extra:?}: {}", stdout(&o));
    }
    let o = run(&["--kubelet-version", "v1.40.0"]);
    assert!(
        stderr(&o).contains("newer than the newest") && stderr(&o).contains("judged as v1.38"),
        "{}",
        stderr(&o)
    );
    // v1.38 is known (v1.37's rules), in every form a node reports it: nothing assumed.
    for version in ["1.38", "v1.38.1", "v1.38.0-alpha.2"] {
        for extra in [
            &["--kubelet-version", version][..],
            &["--kubelet-version", version, "--allow", "user.*"][..],
        ] {
            let o = run(extra);
            assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", stderr(&o));
            assert_eq!(stdout(&o), "Pod/lowat: admit\n", "{extra:?}");
            assert!(
                !stderr(&o).contains("judged as"),
                "{extra:?}: {}",
                stderr(&o)
            );
        }
    }
    for (extra, needle) in [
        (&["--kubelet-version", "latest"][..], r#""latest""#),
        (
            &[
                "--kubelet-version",
                "v1.36.0",
                "--allow",
                "kernel.domainname",
            ][..],
            r#"kubelet v1.36 would not start: the sysctls "kernel.domainname" are not known to be namespaced"#,
        ),
    ] {
        let o = run(extra);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{extra:?}: {}", stderr(&o));
    }
}
