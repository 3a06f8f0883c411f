//! The committed CRD YAML must be what the Rust types generate. `UPDATE_CRDS=1` rewrites it.

use std::path::Path;

use groundskeeper_node_agent::sysctlreport::crd::{CRD_PATHS, REGENERATE, crd_yaml};

#[test]
fn committed_crds_match_the_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let want = crd_yaml();
    let update = std::env::var_os("UPDATE_CRDS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for rel in CRD_PATHS {
        let path = root.join(rel);
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(have) if have == want => {}
            Ok(_) => stale.push(format!("{rel} differs from the generated CRD")),
            Err(e) => stale.push(format!("{rel}: {e}")),
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nregenerate with: {REGENERATE}",
        stale.join("\n")
    );
}

#[test]
fn crd_subcommand_prints_the_same_yaml() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), crd_yaml());
}
