//! The binary's contract with an admin, no cluster needed: bad flags are one line naming the
//! flag and value, and JSON logs are one JSON object per line.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_controller-manager");

#[test]
fn invalid_flag_exits_nonzero_with_one_line() {
    let err = testkit::cli::refused(BIN, &["--leader-elect-retry-period", "2parsecs"]);
    assert!(
        err.contains("--leader-elect-retry-period") && err.contains("2parsecs"),
        "{err}"
    );
}

#[test]
fn unknown_controller_is_named() {
    let err = testkit::cli::refused(BIN, &["--controllers", "podgc,servicecidrs"]);
    assert!(
        err.contains("servicecidrs") && err.contains("--controllers"),
        "{err}"
    );
}

/// Env fallbacks are read under their GROUNDSKEEPER_ names only: an unrelated CONTROLLERS in
/// the environment is not taken for --controllers (the binary gets past its flags and fails
/// on the kubeconfig, exit 1), the prefixed one is (refused by name, exit 2).
#[test]
fn env_fallbacks_are_read_only_under_their_prefixed_names() {
    let run = |var: &str| {
        Command::new(BIN)
            .args(["--admin-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env(var, "not-a-controller")
            .output()
            .unwrap()
    };
    let out = run("CONTROLLERS");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run("GROUNDSKEEPER_CONTROLLERS");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not-a-controller"), "{err}");
}

#[test]
fn webhook_flags_are_refused_naming_the_flag() {
    let err = testkit::cli::refused(BIN, &["--sysctl-webhook"]);
    assert!(err.contains("--webhook-cert-hosts"), "{err}");
    let err = testkit::cli::refused(BIN, &["--allowed-unsafe-sysctls", "vm.swappiness"]);
    assert!(
        err.contains("vm.swappiness") && err.contains("not known to be namespaced"),
        "{err}"
    );
    let err = testkit::cli::refused(BIN, &["--webhook-addr", "nowhere"]);
    assert!(
        err.contains("--webhook-addr") && err.contains("nowhere"),
        "{err}"
    );
}

/// `--logging-format=json` as a pipeline built for kube-controller-manager parses it: one object a
/// line with component-base's keys (`ts` in Unix milliseconds, `caller`, `msg`, `v` on every line
/// but an error's, the error under `err`), and the failure names the bad kubeconfig.
#[test]
fn json_logs_are_one_object_per_line_and_name_the_bad_kubeconfig() {
    let out = Command::new(BIN)
        .args(["--logging-format=json", "--admin-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        !lines.is_empty(),
        "no log lines; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Read after the process ended: every line's time is before it (a second of slack for
    // the clocks' rounding).
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0;
    let mut errors = Vec::new();
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        let ts = v["ts"].as_f64().unwrap_or_else(|| panic!("no ts: {l}"));
        assert!(
            (now_ms - 600_000.0..=now_ms + 1000.0).contains(&ts),
            "ts is not Unix milliseconds of the last minutes: {l}"
        );
        let caller = v["caller"].as_str().unwrap_or_else(|| panic!("{l}"));
        let (file, line) = caller.rsplit_once(':').unwrap_or_else(|| panic!("{l}"));
        assert!(file.ends_with(".rs") && line.parse::<u32>().is_ok(), "{l}");
        assert!(v["msg"].is_string(), "{l}");
        match v.get("v") {
            Some(level) => assert!(level.is_u64(), "{l}"),
            None => errors.push(v.clone()),
        }
        assert!(
            v.get("level").is_none() && v.get("message").is_none(),
            "{l}"
        );
    }
    assert_eq!(errors.len(), 1, "one error line: {stdout}");
    assert_eq!(errors[0]["msg"], "controller-manager failed", "{stdout}");
    let err = errors[0]["err"].as_str().unwrap_or_default();
    assert!(err.contains("/nonexistent/kubeconfig"), "{stdout}");
}

/// Values that parse as numbers but would overflow a timer or make a budget meaningless are
/// refused at start, naming the flag and the value, never a panic later.
#[test]
fn out_of_range_numbers_are_refused_not_panicked_on() {
    let cases: [(&str, &str); 5] = [
        ("--pod-gc-period", "99999999999999999999999s"),
        ("--pod-gc-orphan-quarantine", "10000000h"),
        ("--kube-api-qps", "NaN"),
        ("--kube-api-qps", "1e-30"),
        ("--leader-elect-lease-duration", "1e20s"),
    ];
    for (flag, value) in cases {
        let out = Command::new(BIN)
            .arg(format!("{flag}={value}"))
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}={value}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{flag}={value}: {err}");
        assert!(
            err.contains(flag) && err.contains(value) && !err.contains("panicked"),
            "{flag}={value}: {err}"
        );
    }
}

#[test]
fn blockers_help_states_the_exit_codes() {
    let out = Command::new(BIN)
        .args(["servicecidr", "blockers", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Exit 0 when reported (with --exit-code: 1 when something blocks)")
            && help.contains("2 on errors"),
        "{help}"
    );
}
