#!/usr/bin/env bash
# A real Kubernetes v1.36.2 cluster of several nodes, dual-stack (IPv4 and IPv6), inside
# namespaces of its own, for the end-to-end tests and for a person to explore.
#
#   cluster.sh run [--images DIR] -- CMD...   bring the cluster up, run CMD in the control plane's
#                                              network namespace (KUBECONFIG set), tear down
#   cluster.sh up STATE [--images DIR]        bring it up in the background, state in STATE
#   cluster.sh exec STATE -- CMD...           run CMD in the control plane's network namespace
#   cluster.sh on STATE NODE -- CMD...        run CMD in NODE's network namespace (conntrack,
#                                              iptables-save: what that node's kernel holds)
#   cluster.sh crash STATE NODE               kill NODE's kubelet, containerd, kube-proxy and
#                                              containers at once (its namespaces die with them)
#   cluster.sh start STATE NODE               boot a crashed NODE again, from its disk
#   cluster.sh cut STATE NODE                 take NODE's link down: a partition, processes run on
#   cluster.sh heal STATE NODE                bring NODE's link back up
#   cluster.sh proxy-mode STATE MODE          restart every node with kube-proxy in MODE
#                                             (iptables, the default, or nftables)
#   cluster.sh load STATE IMAGE.tar...        import OCI archives into every node's containerd
#   cluster.sh binaries                       unpack and check the Kubernetes binaries only
#   cluster.sh cost STATE [SECONDS]           each node's and the control plane's RSS and CPU
#   cluster.sh down STATE                     stop it and remove what it left
#
# NODES (default 3) sets the number of worker nodes, gk-node-1 ... gk-node-N.
#
# The layout. The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# the cluster DNS) has a network namespace of its own holding a bridge, gk-br: one L2 segment,
# 172.30.0.0/24 and fd00:30::/64, the control plane at .1. Each node has its own network, mount
# and PID namespace, its own containerd, kubelet and kube-proxy, a veth on the bridge with the
# node's addresses (172.30.0.1N, fd00:30::1N), pod CIDRs of both families (10.244.N.0/24,
# fd00:10:244:N::/64) and routes to the other nodes' pod CIDRs through their node addresses: no
# overlay. Every pod packet crosses its node's netfilter (kube-proxy's rules, the conntrack table
# the node-agent cleans), and each node's conntrack table is its own.
#
# Why namespaces and not the host: nothing of the cluster may be reachable from, or routed to,
# anything outside it, and nothing may outlive it. Each piece is a descendant of one PID 1
# (`unshare --pid --kill-child`), under `setpriv --pdeathsig KILL` of a keeper process that is
# itself under the caller's: when the caller dies, however it dies, the kernel kills every node
# and the control plane, their containers (their PID namespaces nest) and network namespaces
# (unnamed: they die with their last process) and mounts (private). What the kernel cannot reap
# is swept here: empty cgroups under this cluster's cgroup root, at `down` and at the next start.
#
# The paths the daemons hard-code (/var/lib/kubelet, /var/log/pods, /run, ...) are bind mounts
# into STATE inside each node's private mount namespace, so no node writes the machine's own,
# nor another node's. The nodes share one kernel and one cgroup v1 hierarchy: each kubelet has a
# cgroup root of its own, and each daemon a memory cgroup of its own beside the kubelet's pods.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
shared=${SHARED_BIN:-$root/../shared/bin}
target=${CARGO_TARGET_DIR:-$root/target}
bin=$target/e2e/bin
NODES=${NODES:-3}

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

# binaries: the Kubernetes binaries (shared/'s, or upstream's release tarballs) unpacked and
# checked into target/e2e/bin once, and the Debian packages a node needs.
# shellcheck source=e2e/binaries.sh
. "$here/binaries.sh"
# The parts, in e2e/cluster/: functions and the constants they read, nothing run when sourced.
# Every entry of this script has them all: the outside commands, and the pieces it runs again
# inside new namespaces (_cp, _node, the keepers).
#   network.sh        the addresses; a command in the control plane's or a node's network namespace
#   cgroups.sh        the cluster's cgroup root: made, and swept once its keeper is gone
#   pki.sh            the CA, the certificates and the kubeconfigs
#   daemons.sh        what the PID 1s share: a daemon in a memory cgroup, a bounded wait, the watch
#   control-plane.sh  the control plane's PID 1 (_cp): the bridge, etcd, the apiserver, KCM,
#                     the scheduler, dnsmasq
#   node.sh           a node's PID 1 (_node): its addresses, containerd, CNI, kubelet,
#                     kube-proxy
#   keepers.sh        _keeper, _cp_keeper, _node_keeper: each piece dies with its keeper
#   lifecycle.sh      prepare, start, wait until Ready, stop (up, run, down); cost
#   faults.sh         crash, start, cut, heal, proxy-mode
# shellcheck source=e2e/cluster/network.sh
. "$here/cluster/network.sh"
# shellcheck source=e2e/cluster/cgroups.sh
. "$here/cluster/cgroups.sh"
# shellcheck source=e2e/cluster/pki.sh
. "$here/cluster/pki.sh"
# shellcheck source=e2e/cluster/daemons.sh
. "$here/cluster/daemons.sh"
# shellcheck source=e2e/cluster/control-plane.sh
. "$here/cluster/control-plane.sh"
# shellcheck source=e2e/cluster/node.sh
. "$here/cluster/node.sh"
# shellcheck source=e2e/cluster/keepers.sh
. "$here/cluster/keepers.sh"
# shellcheck source=e2e/cluster/lifecycle.sh
. "$here/cluster/lifecycle.sh"
# shellcheck source=e2e/cluster/faults.sh
. "$here/cluster/faults.sh"

cmd=${1:-}
shift || true
case $cmd in
  _cp) control_plane "$@" ;;
  _node) node "$@" ;;
  _keeper) keeper "$@" ;;
  _cp_keeper) cp_keeper "$@" ;;
  _node_keeper) node_keeper "$@" ;;
  binaries) binaries ;;
  cost) cost "${1:?usage: cluster.sh cost STATE [SECONDS]}" "${2:-10}" ;;
  up)
    s=${1:?usage: cluster.sh up STATE [--images DIR]}
    imgs=""
    [ "${2:-}" = --images ] && imgs=$3
    prepare "$s" "$imgs"
    s=$(cd "$s" && pwd)
    # Detached: it stays up for a person after this shell goes; `cluster.sh down` stops it.
    start "$s" setsid </dev/null >>"$s/cluster.log" 2>&1 || { cat "$s/cluster.log" >&2; exit 1; }
    tail -n 1 "$s/cluster.log" >&2
    echo "export KUBECONFIG=$s/admin.kubeconfig   # use it inside: $0 exec $s -- kubectl get nodes"
    ;;
  exec)
    s=${1:?usage: cluster.sh exec STATE -- CMD...}
    shift
    [ "${1:-}" = -- ] && shift
    in_cp "$(cd "$s" && pwd)" "$@"
    ;;
  on)
    s=${1:?usage: cluster.sh on STATE NODE -- CMD...}
    n=${2:?usage: cluster.sh on STATE NODE -- CMD...}
    shift 2
    [ "${1:-}" = -- ] && shift
    in_node "$(cd "$s" && pwd)" "$n" "$@"
    ;;
  proxy-mode) proxy_mode "${1:?usage: cluster.sh proxy-mode STATE iptables|nftables}" "${2:?usage: cluster.sh proxy-mode STATE iptables|nftables}" ;;
  crash) crash "${1:?usage: cluster.sh crash STATE NODE}" "${2:?usage: cluster.sh crash STATE NODE}" ;;
  start) boot "${1:?usage: cluster.sh start STATE NODE}" "${2:?usage: cluster.sh start STATE NODE}" ;;
  cut) link "${1:?usage: cluster.sh cut STATE NODE}" "${2:?usage: cluster.sh cut STATE NODE}" down ;;
  heal) link "${1:?usage: cluster.sh heal STATE NODE}" "${2:?usage: cluster.sh heal STATE NODE}" up ;;
  load)
    s=${1:?usage: cluster.sh load STATE IMAGE.tar...}
    shift
    for sock in "$s"/nodes/*/containerd.sock; do
      for img in "$@"; do
        ctr --address "$sock" -n k8s.io images import --all-platforms "$img" >/dev/null
      done
    done
    ;;
  down) stop "${1:?usage: cluster.sh down STATE}" ;;
  run)
    imgs=""
    if [ "${1:-}" = --images ]; then imgs=$2; shift 2; fi
    [ "${1:-}" = -- ] && shift
    [ $# -gt 0 ] || die "usage: cluster.sh run [--images DIR] -- CMD..."
    s=$(mktemp -d "${TMPDIR:-/tmp}/gk-cluster.XXXXXX")
    trap 'stop "$s"' EXIT
    trap 'exit 130' INT TERM
    prepare "$s" "$imgs"
    t0=$EPOCHREALTIME
    # The cluster dies with this shell, however it dies.
    start "$s" setpriv --pdeathsig KILL
    echo "e2e cluster: $NODES nodes, IPv4+IPv6 ($(awk -v t0="$t0" -v now="$EPOCHREALTIME" 'BEGIN { printf "%.0f", now - t0 }') s to Ready)"
    set +e
    in_cp "$s" env CLUSTER_STATE="$s" NODES="$NODES" "$@"
    rc=$?
    exit $rc
    ;;
  *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
