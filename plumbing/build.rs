//! What `groundskeeper_build_info` reports, fixed at build time: the git commit the crate was
//! built from and the compiler's version. No time stamp, so the same commit and toolchain build
//! the same binary (`make image` depends on it).

use std::{env, path::Path, process::Command};

fn main() {
    let dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    // A build from a source tarball or a container context without .git can be told the commit.
    println!("cargo:rerun-if-env-changed=GROUNDSKEEPER_REVISION");
    let revision = env::var("GROUNDSKEEPER_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .or_else(|| git_revision(Path::new(&dir)))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GROUNDSKEEPER_REVISION={}", revision.trim());

    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = output(Command::new(rustc).arg("--version")).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GROUNDSKEEPER_RUSTC={version}");
}

/// `git rev-parse HEAD`, and the files whose change means a new commit (HEAD, the branch's ref,
/// packed-refs, HEAD's reflog) so cargo runs this again after a commit or a checkout; None
/// without git or outside a repository.
fn git_revision(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| output(Command::new("git").arg("-C").arg(dir).args(args));
    let commit = git(&["rev-parse", "HEAD"])?;
    let mut watched = vec!["HEAD".into(), "packed-refs".into(), "logs/HEAD".into()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for path in watched {
        if let Some(file) = git(&["rev-parse", "--path-format=absolute", "--git-path", &path]) {
            // A watched file that does not exist would make cargo run this on every build.
            if Path::new(&file).exists() {
                println!("cargo:rerun-if-changed={file}");
            }
        }
    }
    Some(commit)
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}
