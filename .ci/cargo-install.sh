#!/usr/bin/env bash
# Installs pinned crates.io tools into .tools/bin with `cargo install --locked` (built from
# source: neither has a prebuilt binary on a registry this project reaches). Does nothing for a
# tool whose pinned version cargo has recorded there (.tools/.crates2.json) and whose binary is
# there. Prints nothing when all are installed.
#   cargo-auditable  image/build.sh builds the release binaries with it as cargo's rustc wrapper
#                    (as `cargo auditable build` does), which embeds their crate list (name,
#                    version, source) in a `.dep-v0` section
#   rust-audit-info  reads that section back (image/sbom_check.sh)
# Usage: cargo-install.sh TOOL...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/.tools
for tool in "$@"; do
  case $tool in
    cargo-auditable) version=0.7.7 ;;
    rust-audit-info) version=0.5.4 ;;
    *) echo "cargo-install.sh: no pinned version of $tool" >&2; exit 1 ;;
  esac
  if [ -x "$tools/bin/$tool" ] && [ -f "$tools/.crates2.json" ] \
    && grep -F "\"$tool $version (" "$tools/.crates2.json" >/dev/null; then
    continue
  fi
  # Its own target folder (over CARGO_TARGET_DIR): not the project's, whose release build it would
  # share, and gone afterwards.
  work=$(mktemp -d)
  echo "cargo-install.sh: building $tool $version (once, into .tools/bin)" >&2
  cargo install --quiet --locked --root "$tools" --target-dir "$work" "$tool@$version" >&2 \
    || { rm -rf "$work"; echo "cargo-install.sh: cargo install $tool@$version failed" >&2; exit 1; }
  rm -rf "$work"
done
