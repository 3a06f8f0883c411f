//! What the plugin's cluster tests share: running the plugin as kubectl runs a plugin, its
//! answer, a second octet of the test run's own, and the read-only rules it needs.

use std::{path::Path, time::Duration};

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-groundskeeper");
const WAIT: Duration = Duration::from_secs(30);

pub struct Answer {
    pub code: i32,
    pub out: String,
    pub err: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.out)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.out, self.err))
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.out, self.err
        )
    }
}

/// Runs the plugin as kubectl runs a plugin: its own arguments, the user's kubeconfig.
pub async fn plugin(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Answer> {
    plugin_with_input(kubeconfig, args, None).await
}

pub async fn plugin_with_input(
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<Answer> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(BIN)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).await?;
    }
    drop(input);
    let out = tokio::time::timeout(WAIT, child.wait_with_output()).await??;
    Ok(Answer {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8(out.stdout)?,
        err: String::from_utf8(out.stderr)?,
    })
}

/// A second octet of our own, so other runs' and tests' ServiceCIDRs do not overlap ours.
pub fn octet() -> u8 {
    (std::process::id() % 200) as u8 + 30
}

/// The rules docs/plugin.md gives the plugin: get and list, nothing else.
pub fn read_only() -> Vec<PolicyRule> {
    let rule = |groups: &[&str], resources: &[&str]| PolicyRule {
        api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: vec!["get".into(), "list".into()],
        ..Default::default()
    };
    vec![
        rule(&[""], &["pods", "nodes", "namespaces", "events"]),
        rule(&["networking.k8s.io"], &["servicecidrs", "ipaddresses"]),
        rule(&["groundskeeper.dev"], &["sysctlpolicies"]),
        rule(&["apps"], &["deployments"]),
    ]
}
