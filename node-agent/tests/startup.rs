//! Start-up contract, no cluster needed: without NODE_NAME the agent refuses to start and
//! says how to set it.

use std::process::Command;

#[test]
fn missing_node_name_exits_nonzero_and_says_how_to_set_it() {
    for value in [None, Some(""), Some("   ")] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_node-agent"));
        cmd.env_remove("NODE_NAME");
        if let Some(v) = value {
            cmd.env("NODE_NAME", v);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "NODE_NAME={value:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("NODE_NAME") && err.contains("fieldPath: spec.nodeName"),
            "{err}"
        );
    }
}

/// Values that parse as numbers but would overflow a timer are refused at start, naming the
/// flag and the value, never a panic later.
#[test]
fn out_of_range_numbers_are_refused_not_panicked_on() {
    let cases: [(&str, &str); 4] = [
        ("--conntrack-gc-max", "99999999h"),
        ("--conntrack-min-interval", "99999999999999999999999s"),
        ("--kube-api-qps", "NaN"),
        ("--conntrack-udp-timeout", "1e20s"),
    ];
    for (flag, value) in cases {
        let err = testkit::cli::refused(
            env!("CARGO_BIN_EXE_node-agent"),
            &[&format!("{flag}={value}")],
        );
        assert!(
            err.contains(flag) && err.contains(value),
            "{flag}={value}: {err}"
        );
    }
}
