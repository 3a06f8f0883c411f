#!/usr/bin/env bash
# Proves `make image` reproducible across checkouts: builds the image of this commit in two
# clones at different paths (different depths too), each with its own target folder, and fails
# unless both print the same digest. Two release builds from scratch: about half an hour on two
# cores, so it is run by hand (and before a release), not by `make test`.
#   bash image/repro_check.sh            # HEAD
#   KEEP=1 bash image/repro_check.sh     # keep the clones and their logs for a diff
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/gk-repro.XXXXXX")
[ -n "${KEEP:-}" ] || trap 'rm -rf "$scratch"' EXIT
# One commit for both clones, fixed now: a commit made while the first one builds must not end
# up in the second (that gives two digests for two commits, not for two paths).
rev=$(git -C "$root" rev-parse HEAD)
[ -z "$(git -C "$root" status --porcelain --untracked-files=no)" ] \
  || echo "repro_check: uncommitted changes are not in the clones: checking HEAD ${rev:0:12}"

digest() {
  local dir=$1
  git clone -q --no-hardlinks "$root" "$dir"
  git -C "$dir" checkout -q --detach "$rev"
  # Each clone's own target folder and nothing from the caller's environment that would change
  # the build but not the sources.
  (cd "$dir" && env -u CARGO_TARGET_DIR -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS -u IMAGE \
    bash image/build.sh >"$dir.log" 2>&1) || { tail -n 30 "$dir.log"; echo "FAIL: make image in $dir"; exit 1; } >&2
  tail -n 1 "$dir.log"
}

a=$(digest "$scratch/one/groundskeeper")
b=$(digest "$scratch/two/a/deeper/path/groundskeeper")
echo "repro_check: $scratch/one/groundskeeper: $a"
echo "repro_check: $scratch/two/a/deeper/path/groundskeeper: $b"
if [ "$a" != "$b" ]; then
  echo "FAIL: make image gave two digests for one commit (KEEP=1 keeps both trees: compare"
  echo "      target/image/rootfs with diffoscope, or the binaries' strings for a path)"
  exit 1
fi
echo "repro_check: one digest from two checkouts of ${rev:0:12}: $a"
