# shellcheck shell=bash disable=SC2034 # the addresses are read by the other parts
# The cluster's network: the control plane's and each node's addresses on the bridge's segment
# (gk-br, made by the control plane's PID 1; each node's veth to it, by its keeper), the pod CIDRs
# of both families, the Services' ranges, and the way in from outside: a command in the control
# plane's or a node's network namespace. Sourced by e2e/cluster.sh.

CP_IP4=172.30.0.1
CP_IP6=fd00:30::1
SERVICE_CIDRS=10.96.0.0/16,fd00:10:96::/112
CLUSTER_CIDRS=10.244.0.0/16,fd00:10:244::/56
DNS_IP=10.96.0.10
APISERVER_VIP=10.96.0.1

node_name() { echo "gk-node-$1"; }
node_ip4() { echo "172.30.0.$((10 + $1))"; }
node_ip6() { echo "fd00:30::$((10 + $1))"; }
pod_cidr4() { echo "10.244.$1.0/24"; }
pod_cidr6() { echo "fd00:10:244:$1::/64"; }
# gk-node-N -> N
node_index() { echo "${1##*-}"; }

# No IPv6 duplicate address detection: on a private segment it only delays every address by
# seconds, and a tentative address cannot be bound.
no_dad() {
  sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
}

# Runs a command in the control plane's network namespace (not its mount namespace: the
# caller's files stay in view), with the admin kubeconfig.
in_cp() {
  local s=$1
  shift
  KUBECONFIG=$s/admin.kubeconfig PATH=$s/bin:$PATH nsenter --target "$(cat "$s/cp/ns-pid")" --net -- "$@"
}

in_node() { # state name cmd...
  local s=$1 name=$2
  shift 2
  [ -s "$s/nodes/$name/ns-pid" ] || die "$name is not running"
  KUBECONFIG=$s/admin.kubeconfig PATH=$s/bin:$PATH nsenter --target "$(cat "$s/nodes/$name/ns-pid")" --net -- "$@"
}
