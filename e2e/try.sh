#!/usr/bin/env bash
# `make node`: brings up a real node (e2e/node.sh), loads the image from `make image`, installs
# the chart and leaves it all running for a person to explore. State in $STATE (/tmp/gk-node).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
state=${STATE:-/tmp/gk-node}
images=$target/e2e/images
[ ! -e "$state/ns-pid" ] || { echo "a node is already up in $state: bash e2e/node.sh down $state" >&2; exit 1; }
mkdir -p "$images" "$state"
bash "$root/image/build.sh" | tail -n 1
cp "$target/image/groundskeeper.oci.tar" "$images/groundskeeper.tar"
bash "$root/e2e/images.sh" all "$images" >/dev/null
bash "$root/e2e/node.sh" up "$state" --images "$images" >/dev/null
in_node() { PATH="$root/.tools/bin:$PATH" bash "$root/e2e/node.sh" exec "$state" -- "$@"; }
in_node "$root/.tools/bin/helm" install gk "$root/charts/groundskeeper" -n groundskeeper --create-namespace \
  --set tests.image.repository=gk.local/tools --set tests.image.tag=1 --wait --timeout 180s >/dev/null
in_node kubectl get pods -A -o wide
cat <<MSG

The node is up, with groundskeeper installed (release gk, namespace groundskeeper). Everything
lives in the node's own network namespace; run commands there:

  bash e2e/node.sh exec $state -- kubectl get servicecidrs
  bash e2e/node.sh exec $state -- kubectl -n groundskeeper logs deploy/gk-groundskeeper-controller-manager
  bash e2e/node.sh exec $state -- bash        # a shell inside, KUBECONFIG set, helm and kubectl on PATH

Stop it: bash e2e/node.sh down $state
MSG
