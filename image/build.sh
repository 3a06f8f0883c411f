#!/usr/bin/env bash
# `make image`: the release binaries in groundskeeper's root filesystem, packed as a one-layer
# OCI archive (target/image/groundskeeper.oci.tar) with no container daemon and no base-image
# pull. Tagged as the chart's default image, so `ctr images import` of this file is what a
# default `helm install` runs. The last line printed is the image digest.
# What is in it is declared where scanners (syft, Trivy, Grype) look: the Debian packages in
# /var/lib/dpkg (image/rootfs.sh), each binary's crates in its `.dep-v0` section (cargo
# auditable; .ci/cargo-install.sh builds the pinned cargo-auditable into .tools/bin the first
# time), and OCI labels in the image config. image/sbom_check.sh reads all three back.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
out=$target/image
tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$root/charts/groundskeeper/Chart.yaml")
registry=$(sed -n 's/^  registry: *//p' "$root/charts/groundskeeper/values.yaml" | head -n 1)
repo=$(sed -n 's/^  repository: *//p' "$root/charts/groundskeeper/values.yaml" | head -n 1)
name=${IMAGE:-${registry:+$registry/}$repo:$tag}

# No path of this machine in the binaries (panic locations and file!() in the dependencies, in
# code build scripts generate under the target folder): the digest must not depend on where the
# checkout, its target folder or cargo's home are. rustc applies the last prefix that matches, so
# the most specific comes last. image/repro_check.sh proves it with two checkouts.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
flags=()
[ -z "${RUSTFLAGS:-}" ] || read -ra flags <<<"$RUSTFLAGS"
flags+=("--remap-path-prefix=$cargo_home=/cargo" "--remap-path-prefix=$root=/src" "--remap-path-prefix=$target=/src/target")
# `cargo auditable build --locked`, spelled out: cargo-auditable as cargo's rustc wrapper for
# the workspace's crates, with the flags `cargo auditable` would hand it (CARGO_AUDITABLE_ORIG_ARGS,
# the pinned version's format) for its `cargo metadata`. Named by its bare name, found on the
# PATH: cargo hashes the wrapper as written into each workspace crate's -C metadata, and
# `cargo auditable` names its own absolute path, which would tie the digest to the checkout's.
bash "$root/.ci/cargo-install.sh" cargo-auditable
CARGO_ENCODED_RUSTFLAGS=$(IFS=$'\x1f'; echo "${flags[*]}") PATH="$root/.tools/bin:$PATH" \
  RUSTC_WORKSPACE_WRAPPER=cargo-auditable \
  CARGO_AUDITABLE_ORIG_ARGS='{"offline":false,"locked":true,"frozen":false,"config":[]}' \
  cargo build --release --locked --bins -p groundskeeper-controllers -p groundskeeper-node-agent >&2
bash "$root/image/rootfs.sh" "$out/rootfs" "$out/debs" >&2
install -D -m 0755 "$target/release/controller-manager" "$out/rootfs/usr/local/bin/controller-manager"
install -D -m 0755 "$target/release/node-agent" "$out/rootfs/usr/local/bin/node-agent"
install -D -m 0755 "$target/release/kubectl-groundskeeper" "$out/rootfs/usr/local/bin/kubectl-groundskeeper"

# The OCI labels. The commit and its time, as plumbing/build.rs finds the commit for
# groundskeeper_build_info: GROUNDSKEEPER_REVISION, else git; SOURCE_DATE_EPOCH, else the commit's
# time: every file's mtime in the layer and the image's `created`. One commit, one digest: no
# clock is read. Without either (no .git) neither label is set, and the files' time is 0.
chart=$root/charts/groundskeeper/Chart.yaml
revision=${GROUNDSKEEPER_REVISION:-$(git -C "$root" rev-parse HEAD 2>/dev/null || true)}
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct HEAD 2>/dev/null || echo 0)}
labels=(
  "org.opencontainers.image.title=groundskeeper"
  "org.opencontainers.image.description=$(awk '/^description:/ { on = 1; next } on && /^  / { sub(/^ +/, ""); d = d (d ? " " : "") $0; next } on { exit } END { print d }' "$chart")"
  "org.opencontainers.image.source=$(sed -n 's/^home: *//p' "$chart")"
  "org.opencontainers.image.version=$tag"
  "org.opencontainers.image.licenses=$(sed -n 's/^license *= *"\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)"
)
[ -z "$revision" ] || labels+=("org.opencontainers.image.revision=$revision")
[ "$epoch" = 0 ] || labels+=("org.opencontainers.image.created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)")
label_args=()
for l in "${labels[@]}"; do label_args+=(--label "$l"); done

# The architecture of the binaries and of the Debian packages just fetched: this machine's (the
# release workflow builds arm64 on an arm64 runner).
SOURCE_DATE_EPOCH=$epoch python3 "$root/image/oci.py" "$out/rootfs" "$out/groundskeeper.oci.tar" "$name" \
  --arch "$(dpkg --print-architecture)" --entrypoint /usr/local/bin/controller-manager --user 65532:65532 \
  "${label_args[@]}"
