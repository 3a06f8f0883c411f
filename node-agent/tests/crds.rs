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

/// `kubectl explain sysctlpolicy[.FIELD]` says what each thing is, in one line, and `kubectl get
/// groundskeeper` lists the policies.
#[test]
fn every_field_has_a_one_line_description() {
    let crd: serde_json::Value = serde_norway::from_str(&crd_yaml()).unwrap();
    assert_eq!(
        crd["spec"]["names"]["categories"],
        serde_json::json!(["groundskeeper"])
    );
    let mut missing = Vec::new();
    for version in crd["spec"]["versions"].as_array().unwrap() {
        let name = version["name"].as_str().unwrap();
        describe(name, &version["schema"]["openAPIV3Schema"], &mut missing);
    }
    assert!(
        missing.is_empty(),
        "not one described line (a doc comment on the type or field): {missing:#?}"
    );
}

/// Checks the schema at `path` and every property below it (through lists and maps too).
fn describe(path: &str, schema: &serde_json::Value, missing: &mut Vec<String>) {
    match schema["description"].as_str() {
        Some(d) if !d.trim().is_empty() && !d.contains('\n') => {}
        other => missing.push(format!("{path}: {other:?}")),
    }
    let mut below = schema;
    while let Some(inner) = below.get("items").or(below.get("additionalProperties")) {
        below = inner;
    }
    for (field, sub) in below["properties"].as_object().into_iter().flatten() {
        describe(&format!("{path}.{field}"), sub, missing);
    }
}
