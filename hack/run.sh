#!/usr/bin/env bash
# `make run`: both binaries out of cluster, in dry-run unless DRY_RUN=false. The route, chosen
# before any build (`choose`):
# - KUBE_APISERVER set: a throwaway control plane of their own from it (with etcd and openssl),
#   whatever the kube context: asking for one is never overruled by a cluster that answers;
# - else the current kube context when it answers (or NODE_NAME names its node), announced first:
#   the context, its server and whether the binaries run in dry-run;
# - else a throwaway control plane from ../shared/bin/kube-apiserver or kube-apiserver on the PATH;
# - else one line saying what to do, and exit 2.
# Exits with the binaries' status: 0 when both stopped cleanly (Ctrl-C), else the first failure's.
# `hack/run.sh binaries`: only the binaries, against KUBECONFIG, for NODE_NAME.
# `hack/run.sh route`: only the choice: the route's name (cluster, control-plane), then what
# `make run` would print before building; nothing to run against: the line, and exit 2.
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

case $DRY_RUN in
  true | false) ;;
  *) echo "make run: DRY_RUN is true or false, not \"$DRY_RUN\"" >&2; exit 2 ;;
esac
kubectl=${KUBECTL:-$(command -v kubectl || echo "$root/.tools/bin/kubectl")}
etcd=${KUBE_ETCD:-/usr/bin/etcd}

# The current kube context's name and server, as kubectl reads them (the binaries read the same
# KUBECONFIG); no request is made.
context() {
  "$kubectl" config current-context 2>/dev/null || true
}
server() {
  "$kubectl" config view --minify -o jsonpath='{.clusters[0].cluster.server}' 2>/dev/null || true
}

# Sets route (cluster, control-plane or none) and what it needs: node; apiserver; or why.
choose() {
  route=none node=${NODE_NAME:-} apiserver=${KUBE_APISERVER:-} why=
  if [ -z "$apiserver" ]; then
    if [ -z "$node" ] && [ -x "$kubectl" ]; then
      node=$("$kubectl" get nodes --request-timeout=5s -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
    fi
    if [ -n "$node" ]; then
      route=cluster
      return
    fi
    if [ -x "$root/../shared/bin/kube-apiserver" ]; then
      apiserver=$(cd "$root/../shared/bin" && pwd)/kube-apiserver
    fi
    [ -n "$apiserver" ] || apiserver=$(command -v kube-apiserver || true)
  fi
  local missing=()
  if [ -n "${KUBE_APISERVER:-}" ]; then
    [ -f "$apiserver" ] && [ -x "$apiserver" ] || missing+=("a kube-apiserver binary at KUBE_APISERVER=$apiserver (no executable file there)")
  else
    [ -n "$apiserver" ] || missing+=("a kube-apiserver binary (v1.33+: make run KUBE_APISERVER=/path/to/kube-apiserver, or on the PATH)")
  fi
  [ -x "$etcd" ] || missing+=("etcd (apt-get install etcd-server, or KUBE_ETCD=/path)")
  command -v openssl >/dev/null || missing+=("openssl (apt-get install openssl)")
  if [ ${#missing[@]} -eq 0 ]; then
    route=control-plane
    return
  fi
  local ctx what
  if [ -n "${KUBE_APISERVER:-}" ]; then
    what="KUBE_APISERVER asks for a throwaway control plane, which needs"
  else
    if [ ! -x "$kubectl" ]; then
      ctx="no kubectl to ask the kube context (bash .ci/tools.sh installs one)"
    elif ctx=$(context) && [ -n "$ctx" ]; then
      ctx="kube context \"$ctx\" at $(server) does not answer"
    else
      ctx="no kube context (KUBECONFIG, ~/.kube/config)"
    fi
    what="nothing to run against: $ctx; point KUBECONFIG at a reachable cluster, or for a throwaway control plane install"
  fi
  why=$(IFS=','; echo "make run: $what:${missing[*]/#/ }")
}

# What `make run` says before building: where it acts, and with what.
announce() {
  case $route in
    cluster)
      local ctx srv
      ctx=$(context) srv=$(server)
      echo "make run: against kube context \"${ctx:-(none: in-cluster config)}\" at ${srv:-(no server)}, node $node"
      if [ "$DRY_RUN" = true ]; then
        echo "make run: dry-run: every deletion, finalizer removal and pod rejection is logged, none is made (DRY_RUN=false makes them)"
      else
        echo "make run: DRY_RUN=false: deletions, finalizer removals and pod rejections are made in that cluster, and the node-agent cleans this machine's conntrack table"
      fi
      ;;
    control-plane)
      if [ -n "${KUBE_APISERVER:-}" ]; then
        echo "make run: KUBE_APISERVER is set: starting a throwaway control plane from $apiserver (etcd $etcd), not the current kube context"
      else
        echo "make run: no reachable cluster: starting a throwaway control plane from $apiserver (etcd $etcd)"
      fi
      ;;
  esac
}

choose
if [ "$route" = none ]; then
  echo "$why" >&2
  exit 2
fi
if [ "${1:-}" = route ]; then
  echo "$route"
  announce
  exit
fi
announce
"$cargo" build --workspace --bins
if [ "$route" = cluster ]; then
  NODE_NAME=$node binaries
  exit
fi
KUBE_APISERVER=$apiserver KUBE_ETCD=$etcd NODE_NAME=groundskeeper-demo \
  exec "$target/debug/control-plane" --node groundskeeper-demo --crd "$root/crds/sysctlpolicies.groundskeeper.dev.yaml" \
  -- bash "$0" binaries
