#!/usr/bin/env bash
# `make e2e`: builds the image (make image) and the test images, brings up a real cluster of
# NODES (default 3) dual-stack nodes (e2e/cluster.sh), installs the chart with helm, runs every
# end-to-end test (e2e/suite.sh) and tears the cluster down. Needs root, the node's Debian packages (bash .ci/run installs them) and
# helm/kubectl (.ci/tools.sh). Last line: "e2e: N passed, M failed".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
images=$target/e2e/images
[ "$(id -u)" = 0 ] || { echo "e2e: needs root (namespaces, containerd, kubelet)" >&2; exit 1; }
bash "$root/.ci/tools.sh" >/dev/null
mkdir -p "$images"
echo "e2e: building the image (make image)"
digest=$(bash "$root/image/build.sh" | tail -n 1)
echo "e2e: image $digest"
cp "$target/image/groundskeeper.oci.tar" "$images/groundskeeper.tar"
bash "$root/e2e/images.sh" all "$images" >/dev/null
exec bash "$root/e2e/cluster.sh" run --images "$images" -- \
  env HELM="$root/.tools/bin/helm" PATH="$root/.tools/bin:$PATH" bash "$root/e2e/suite.sh"
