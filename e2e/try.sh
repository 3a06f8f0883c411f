#!/usr/bin/env bash
# `make cluster`: brings up a real cluster of NODES (default 3) dual-stack nodes (e2e/cluster.sh),
# loads the image from `make image`, installs the chart and leaves it all running for a person
# to explore. State in $STATE (/tmp/gk-cluster).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
state=${STATE:-/tmp/gk-cluster}
images=$target/e2e/images
[ ! -e "$state/keeper-pid" ] || { echo "a cluster is already up in $state: bash e2e/cluster.sh down $state" >&2; exit 1; }
mkdir -p "$images" "$state"
bash "$root/image/build.sh" | tail -n 1
cp "$target/image/groundskeeper.oci.tar" "$images/groundskeeper.tar"
bash "$root/e2e/images.sh" all "$images" >/dev/null
bash "$root/e2e/cluster.sh" up "$state" --images "$images" >/dev/null
in_cp() { PATH="$root/.tools/bin:$PATH" bash "$root/e2e/cluster.sh" exec "$state" -- "$@"; }
in_cp "$root/.tools/bin/helm" install gk "$root/charts/groundskeeper" -n groundskeeper --create-namespace \
  --set tests.image.registry=gk.local --set tests.image.repository=tools --set tests.image.tag=1 --wait --timeout 180s >/dev/null
in_cp kubectl get nodes -o wide
in_cp kubectl get pods -A -o wide
cat <<MSG

The cluster is up, with groundskeeper installed (release gk, namespace groundskeeper). It lives
in namespaces of its own; run commands in the control plane's network namespace:

  bash e2e/cluster.sh exec $state -- kubectl get servicecidrs
  bash e2e/cluster.sh exec $state -- kubectl -n groundskeeper logs deploy/gk-groundskeeper-controller-manager
  bash e2e/cluster.sh exec $state -- bash     # a shell there, KUBECONFIG set, helm and kubectl on PATH
  bash e2e/cluster.sh on $state gk-node-2 -- conntrack -L     # one node's own conntrack table

Faults: bash e2e/cluster.sh crash|start|cut|heal $state gk-node-2
Stop it: bash e2e/cluster.sh down $state
MSG
