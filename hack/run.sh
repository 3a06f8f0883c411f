#!/usr/bin/env bash
# `make run`: both binaries out of cluster, in dry-run unless DRY_RUN=false. Against the current
# kube context when one answers; else against a throwaway control plane of their own, from
# KUBE_APISERVER, ../shared/bin/kube-apiserver or kube-apiserver on the PATH (with etcd and
# openssl); else one line saying what to install, before any build. Exits with the binaries'
# status: 0 when both stopped cleanly (Ctrl-C), else the first failure's.
# `hack/run.sh binaries`: only the binaries, against KUBECONFIG, for NODE_NAME.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${TARGET_DIR:-${CARGO_TARGET_DIR:-$root/target}}
cargo=${CARGO:-cargo}
DRY_RUN=${DRY_RUN:-true}

binaries() {
  echo "controller-manager on 127.0.0.1:8080, node-agent (NODE_NAME=${NODE_NAME:-}) on 127.0.0.1:8081, dry-run=$DRY_RUN"
  GROUNDSKEEPER_DRY_RUN=$DRY_RUN "$target/debug/controller-manager" --admin-addr 127.0.0.1:8080 --leader-elect=false &
  local cm=$!
  GROUNDSKEEPER_DRY_RUN=$DRY_RUN NODE_NAME=${NODE_NAME:-} "$target/debug/node-agent" --admin-addr 127.0.0.1:8081 &
  local na=$!
  # Ctrl-C reaches both through the terminal; SIGTERM to this script is passed on.
  trap 'kill -TERM $cm $na 2>/dev/null || true' INT TERM
  local pids=("$cm" "$na") rc=0 ended status rest pid
  while [ ${#pids[@]} -gt 0 ]; do
    # `wait -p` unsets its variable first and leaves it unset when a signal interrupts the wait:
    # read it as "${ended:-}", as `set -u` requires.
    ended=
    wait -n -p ended "${pids[@]}" && status=0 || status=$?
    # No pid: a signal interrupted the wait (the trap has stopped both); wait for them again.
    [ -n "${ended:-}" ] || continue
    [ "$rc" -ne 0 ] || rc=$status
    rest=()
    for pid in "${pids[@]}"; do [ "$pid" = "$ended" ] || rest+=("$pid"); done
    pids=("${rest[@]}")
    # Half of `make run` is no run: when one binary ends, the other is stopped too.
    [ ${#pids[@]} -eq 0 ] || kill -TERM "${pids[@]}" 2>/dev/null || true
  done
  return "$rc"
}

if [ "${1:-}" = binaries ]; then
  binaries
  exit
fi

kubectl=${KUBECTL:-$(command -v kubectl || echo "$root/.tools/bin/kubectl")}
node=${NODE_NAME:-}
if [ -z "$node" ] && [ -x "$kubectl" ]; then
  node=$("$kubectl" get nodes --request-timeout=5s -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
fi
if [ -n "$node" ]; then
  "$cargo" build --workspace --bins
  NODE_NAME=$node binaries
  exit
fi

apiserver=${KUBE_APISERVER:-}
if [ -z "$apiserver" ] && [ -x "$root/../shared/bin/kube-apiserver" ]; then
  apiserver=$(cd "$root/../shared/bin" && pwd)/kube-apiserver
fi
[ -n "$apiserver" ] || apiserver=$(command -v kube-apiserver || true)
etcd=${KUBE_ETCD:-/usr/bin/etcd}
missing=()
[ -n "$apiserver" ] || missing+=("a kube-apiserver binary (v1.33+, on the PATH or KUBE_APISERVER=/path)")
[ -x "$etcd" ] || missing+=("etcd (apt-get install etcd-server, or KUBE_ETCD=/path)")
command -v openssl >/dev/null || missing+=("openssl (apt-get install openssl)")
if [ ${#missing[@]} -gt 0 ]; then
  (IFS=','; echo "make run: no reachable kube context, and for a throwaway control plane install:${missing[*]/#/ } (or set KUBECONFIG to a cluster)" >&2)
  exit 2
fi
"$cargo" build --workspace --bins
echo "no reachable cluster: starting a throwaway control plane from $apiserver (etcd $etcd)"
KUBE_APISERVER=$apiserver KUBE_ETCD=$etcd NODE_NAME=groundskeeper-demo \
  exec "$target/debug/control-plane" --node groundskeeper-demo --crd "$root/crds/sysctlpolicies.groundskeeper.dev.yaml" \
  -- bash "$0" binaries
