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
CP_IP4=172.30.0.1
CP_IP6=fd00:30::1
SERVICE_CIDRS=10.96.0.0/16,fd00:10:96::/112
CLUSTER_CIDRS=10.244.0.0/16,fd00:10:244::/56
DNS_IP=10.96.0.10
APISERVER_VIP=10.96.0.1
# CAP_SYS_RESOURCE is bit 24 of the effective set.
CAP_SYS_RESOURCE=24

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

node_name() { echo "gk-node-$1"; }
node_ip4() { echo "172.30.0.$((10 + $1))"; }
node_ip6() { echo "fd00:30::$((10 + $1))"; }
pod_cidr4() { echo "10.244.$1.0/24"; }
pod_cidr6() { echo "fd00:10:244:$1::/64"; }
# gk-node-N -> N
node_index() { echo "${1##*-}"; }

# --- binaries ------------------------------------------------------------------------------

# binaries: the Kubernetes binaries (shared/'s, or upstream's release tarballs) unpacked and
# checked into target/e2e/bin once, and the Debian packages a node needs.
# shellcheck source=e2e/binaries.sh
. "$here/binaries.sh"

# --- cgroups -------------------------------------------------------------------------------

# The cluster's cgroup root sits under this process's own memory cgroup, so the cluster's memory
# stays accounted where the caller's is; the same path is used in every v1 hierarchy, as the
# cgroupfs driver requires.
cgroup_base() {
  local mem
  mem=$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
  echo "${mem%/}/groundskeeper-e2e"
}

cgroup_create() {
  local path=$1 h
  for h in /sys/fs/cgroup/*/; do
    h=${h%/}
    case $(basename "$h") in unified) continue ;; esac
    mkdir -p "$h$path"
    if [ -f "$h/cpuset.cpus" ]; then
      # A new cpuset is empty and takes no task until its cpus and mems are filled in.
      local p="" part
      for part in ${path//\// }; do
        p="$p/$part"
        [ -s "$h$p/cpuset.cpus" ] || cat "$(dirname "$h$p")/cpuset.cpus" > "$h$p/cpuset.cpus"
        [ -s "$h$p/cpuset.mems" ] || cat "$(dirname "$h$p")/cpuset.mems" > "$h$p/cpuset.mems"
      done
    fi
  done
}

# Removes the empty cgroups of clusters whose keeper is gone (named by its host PID); a cgroup
# that still holds a task is left alone, as rmdir refuses it.
cgroup_sweep() {
  local base h d
  base=$(cgroup_base)
  for h in /sys/fs/cgroup/*/; do
    for d in "${h%/}$base"/cluster-* "${h%/}$base"/node-*; do
      [ -d "$d" ] && [ ! -e "/proc/${d##*-}" ] || continue
      find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  done
}

# --- PKI and kubeconfigs -------------------------------------------------------------------

pki() {
  local d=$1 i
  mkdir -p "$d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout ca.key -out ca.crt -subj "/CN=groundskeeper-e2e-ca" 2>/dev/null
    cert() { # name subject extensions
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      printf '%b' "$3" > "$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out "$1.crt" -extfile "$1.ext" 2>/dev/null
    }
    cert apiserver "/CN=kube-apiserver" \
      "subjectAltName=IP:$CP_IP4,IP:$CP_IP6,IP:$APISERVER_VIP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    cert admin "/O=system:masters/CN=groundskeeper-e2e-admin" "extendedKeyUsage=clientAuth\n"
    for ((i = 1; i <= NODES; i++)); do
      local n
      n=$(node_name "$i")
      cert "kubelet-$n" "/O=system:nodes/CN=system:node:$n" "extendedKeyUsage=clientAuth\n"
      cert "serving-$n" "/CN=$n" "subjectAltName=IP:$(node_ip4 "$i"),IP:$(node_ip6 "$i"),DNS:$n\nextendedKeyUsage=serverAuth\n"
    done
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext
  )
}

kubeconfig() { # out server cert-name
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "$2", certificate-authority: "$S/pki/ca.crt"}
users:
- name: u
  user: {client-certificate: "$S/pki/$3.crt", client-key: "$S/pki/$3.key"}
contexts:
- name: e2e
  context: {cluster: e2e, user: u}
current-context: e2e
EOF
}

# --- shared by the control plane's and the nodes' PID 1 -----------------------------------

wait_for() { # what seconds cmd...
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "$what did not come up within $secs s (see $D/logs/)"
}
tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
apiserver_ready() { "$S/bin/kubectl" --kubeconfig "$S/admin.kubeconfig" get --raw /readyz; }

# Each daemon runs in a memory cgroup of its own, CGROUP_ROOT/daemons/NAME (beside the kubelet's
# kubepods), as a container would: its working set is read the way kubelet reads a container's
# (e2e/memory.py). Only the memory hierarchy: a CPU cgroup of its own would change how the
# daemons share the cores with each other and with the machine.
daemon() { # name cmd...
  local name=$1
  shift
  (
    daemon_cgroup "$CGROUP_ROOT/daemons/$name" || log "$name: no memory cgroup of its own; it runs in its parent's"
    exec "$@"
  ) >> "$D/logs/$name.log" 2>&1 &
  echo $! > "$D/pids/$name"
}
# Moves the calling (sub)shell into the cgroup v1 memory cgroup PATH, made first.
daemon_cgroup() { # path
  local dir=/sys/fs/cgroup/memory$1
  [ -e /sys/fs/cgroup/memory/memory.usage_in_bytes ] && mkdir -p "$dir" && echo "$BASHPID" > "$dir/cgroup.procs"
}

# PID 1 stays; when any daemon dies the cluster is broken, and saying so beats a hung test.
watch_daemons() {
  touch "$D/started"
  while sleep 2; do
    for f in "$D"/pids/*; do
      kill -0 "$(cat "$f")" 2>/dev/null || { log "$(basename "$f") exited (see $D/logs/$(basename "$f").log)"; touch "$D/broken"; }
    done
  done
}

# No IPv6 duplicate address detection: on a private segment it only delays every address by
# seconds, and a tentative address cannot be bound.
no_dad() {
  sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
}

# --- inside: PID 1 of the control plane ------------------------------------------------------

control_plane() {
  S=$1 D=$1/cp
  trap 'kill -TERM $(cat "$D"/pids/* 2>/dev/null) 2>/dev/null; exit 0' TERM INT
  mkdir -p "$D/logs" "$D/pids"
  mount -t tmpfs -o mode=0755 tmpfs /run
  ip link set lo up
  no_dad
  ip link add gk-br type bridge
  ip addr add "$CP_IP4/24" dev gk-br
  ip -6 addr add "$CP_IP6/64" dev gk-br nodad
  ip link set gk-br up
  # The bridge only switches: no netfilter for frames crossing it (where the kernel has the
  # knob), so the nodes see each other's packets as a switch would pass them.
  sysctl -qw net.bridge.bridge-nf-call-iptables=0 net.bridge.bridge-nf-call-ip6tables=0 2>/dev/null || true
  local i
  for ((i = 1; i <= NODES; i++)); do
    ip route add "$(pod_cidr4 "$i")" via "$(node_ip4 "$i")"
    ip -6 route add "$(pod_cidr6 "$i")" via "$(node_ip6 "$i")"
  done
  echo "nameserver $CP_IP4" > "$S/host-resolv.conf"
  mount --bind "$S/host-resolv.conf" /etc/resolv.conf

  daemon etcd /usr/bin/etcd --name e2e --data-dir "$D/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster e2e=http://127.0.0.1:2380 \
    --log-level warn --quota-backend-bytes 2147483648
  wait_for etcd 30 tcp_open 127.0.0.1 2379
  cat > "$D/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  verbs: [get, list, watch]
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}, {group: "", resources: [events]}]
  users: [system:kube-controller-manager, system:kube-scheduler]
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}, {group: "", resources: [events, nodes/status]}]
  userGroups: [system:nodes]
- level: Metadata
EOF
  local p=$S/pki
  # --enable-aggregator-routing: the apiserver calls webhooks at their endpoints' pod IPs (it
  # runs no kube-proxy, so a ClusterIP means nothing here), as on clusters whose control plane
  # is outside the pod network's proxying.
  daemon kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --advertise-address="$CP_IP4" --secure-port=6443 \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
    --kubelet-preferred-address-types=InternalIP --kubelet-client-certificate="$p/admin.crt" --kubelet-client-key="$p/admin.key" \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$p/sa.pub" \
    --service-account-signing-key-file="$p/sa.key" --service-cluster-ip-range="$SERVICE_CIDRS" \
    --authorization-mode=Node,RBAC --allow-privileged=true --enable-admission-plugins=NodeRestriction \
    --enable-aggregator-routing=true \
    --audit-policy-file="$D/audit-policy.yaml" --audit-log-path="$D/logs/audit.log" --audit-log-format=json \
    --audit-log-maxsize=0 --profiling=false -v=1
  wait_for kube-apiserver 60 apiserver_ready

  daemon kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$S/admin.kubeconfig" \
    --authentication-kubeconfig="$S/admin.kubeconfig" --authorization-kubeconfig="$S/admin.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --root-ca-file="$p/ca.crt" \
    --service-account-private-key-file="$p/sa.key" --use-service-account-credentials=true \
    --controllers='*,-pod-garbage-collector-controller,-service-cidr-controller' \
    --cluster-cidr="$CLUSTER_CIDRS" --service-cluster-ip-range="$SERVICE_CIDRS" \
    --node-monitor-grace-period=20s -v=1
  daemon kube-scheduler "$bin/kube-scheduler" --kubeconfig="$S/admin.kubeconfig" \
    --authentication-kubeconfig="$S/admin.kubeconfig" --authorization-kubeconfig="$S/admin.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false -v=1
  dns
  watch_daemons
}

# Cluster DNS: dnsmasq on the bridge behind the kube-dns Service, answering the cluster domain
# from a hosts file that a loop refreshes from the Service list (names of Services, not pods).
dns() {
  local k="$S/bin/kubectl --kubeconfig $S/admin.kubeconfig"
  command -v dnsmasq >/dev/null || { log "no dnsmasq: pods get no cluster DNS (apt-get install dnsmasq-base)"; return 0; }
  $k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_IP
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-cp
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: groundskeeper-e2e}
addressType: IPv4
endpoints: [{addresses: ["$CP_IP4"], conditions: {ready: true}}]
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
EOF
  : > "$D/dns-hosts"
  daemon dnsmasq dnsmasq --keep-in-foreground --no-resolv --no-hosts --addn-hosts="$D/dns-hosts" \
    --listen-address="$CP_IP4" --bind-interfaces --local=/cluster.local/ --pid-file= --user=root --log-facility=-
  local d
  d=$(cat "$D/pids/dnsmasq")
  (
    while sleep 1; do
      $k get svc -A -o jsonpath='{range .items[*]}{range .spec.clusterIPs[*]}{@} {end}{"\t"}{.metadata.name}.{.metadata.namespace}.svc.cluster.local{"\n"}{end}' \
        2>/dev/null | awk -F'\t' '{ n = split($1, ips, " "); for (i = 1; i <= n; i++) if (ips[i] != "None") print ips[i], $2 }' \
        > "$D/dns-hosts.new" || continue
      cmp -s "$D/dns-hosts.new" "$D/dns-hosts" || { mv "$D/dns-hosts.new" "$D/dns-hosts"; kill -HUP "$d"; }
    done
  ) &
}

# --- inside: PID 1 of a node -----------------------------------------------------------------

node() {
  S=$1
  local name=$2 i
  i=$(node_index "$name")
  D=$S/nodes/$name
  trap 'kill -TERM $(cat "$D"/pids/* 2>/dev/null) 2>/dev/null; exit 0' TERM INT
  rm -rf "$D/logs.prev" && { [ ! -d "$D/logs" ] || mv "$D/logs" "$D/logs.prev"; }
  mkdir -p "$D/logs" "$D/pids"
  rm -f "$D"/pids/* "$D/started" "$D/broken"
  local ip4 ip6
  ip4=$(node_ip4 "$i")
  ip6=$(node_ip6 "$i")

  # The keeper puts this node's end of its veth here as eth0.
  ip link set lo up
  no_dad
  local n
  for ((n = 0; n < 100; n++)); do ip link show eth0 >/dev/null 2>&1 && break; sleep 0.1; done
  ip link show eth0 >/dev/null 2>&1 || die "$name: no eth0"
  ip addr add "$ip4/24" dev eth0
  ip -6 addr add "$ip6/64" dev eth0 nodad
  ip link set eth0 up
  ip route add default via "$CP_IP4" dev eth0
  ip -6 route add default via "$CP_IP6" dev eth0
  local j
  for ((j = 1; j <= NODES; j++)); do
    [ "$j" = "$i" ] && continue
    ip route add "$(pod_cidr4 "$j")" via "$(node_ip4 "$j")"
    ip -6 route add "$(pod_cidr6 "$j")" via "$(node_ip6 "$j")"
  done
  sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1

  # Private copies of the paths the daemons hard-code.
  mount -t tmpfs -o mode=0755 tmpfs /run
  local m
  for m in /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/containerd /var/lib/cni /etc/cni/net.d /var/lib/kube-proxy /opt/containerd; do
    mkdir -p "$m" "$D/fs$m"
    mount --bind "$D/fs$m" "$m"
  done
  mkdir -p /run/containerd
  # Names resolve inside the cluster or not at all: the machine's resolver is not in this network.
  mount --bind "$S/host-resolv.conf" /etc/resolv.conf

  # containerd, its own root, state and socket; CNI from /usr/lib/cni.
  local runtime=/usr/sbin/runc caps
  caps=$(awk '/^CapEff/ {print $2}' /proc/self/status)
  if ((((0x$caps >> CAP_SYS_RESOURCE) & 1) == 0)); then
    runtime=$S/runc-clamp-oom
  fi
  cat > "$D/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$D/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "gk.local/pause:1"
  enable_unprivileged_ports = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$runtime"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
EOF
  # ptp: a veth per pod, no bridge, no masquerade, so every pod's packet crosses this node's
  # netfilter (kube-proxy's rules, the conntrack table the agent cleans); both families.
  cat > /etc/cni/net.d/10-ptp.conflist <<EOF
{"cniVersion": "0.4.0", "name": "e2e", "plugins": [
  {"type": "ptp", "ipMasq": false, "mtu": 1500,
   "ipam": {"type": "host-local",
            "ranges": [[{"subnet": "$(pod_cidr4 "$i")"}], [{"subnet": "$(pod_cidr6 "$i")"}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  rm -f "$D/containerd.sock"
  daemon containerd containerd --config "$D/containerd.toml"
  wait_for containerd 20 test -S "$D/containerd.sock"
  # Images are imported once, at the first boot: a node booted again has them on its disk.
  if [ ! -e "$D/images-loaded" ]; then
    local img
    for img in "$S"/images/*.tar; do
      [ -f "$img" ] && ctr --address "$D/containerd.sock" -n k8s.io images import --all-platforms "$img" >/dev/null
    done
    touch "$D/images-loaded"
  fi

  local p=$S/pki
  cat > "$D/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$D/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $p/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $p/serving-$name.crt
tlsPrivateKeyFile: $p/serving-$name.key
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: $S/resolv.conf
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
failSwapOn: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
# The sysctl tests need a namespaced sysctl that kubelet allows and a policy forbids.
allowedUnsafeSysctls: ["kernel.msg*"]
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
EOF
  daemon kubelet "$bin/kubelet" --config="$D/kubelet.yaml" --kubeconfig="$D/kubelet.kubeconfig" \
    --node-ip="$ip4,$ip6" --hostname-override="$name" -v=1
  # kube-proxy's mode (iptables unless `cluster.sh proxy-mode` said otherwise), read at each boot.
  cat > "$D/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: $(cat "$S/proxy-mode" 2>/dev/null || echo iptables)
clientConnection: {kubeconfig: $S/admin.kubeconfig}
hostnameOverride: $name
clusterCIDR: $CLUSTER_CIDRS
# nf_conntrack_max is read-only outside the host's root network namespace.
conntrack: {maxPerCore: 0, min: 0}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
  daemon kube-proxy "$bin/kube-proxy" --config="$D/kube-proxy.yaml" -v=1
  watch_daemons
}

# Why this exists: this machine kind gives root no CAP_SYS_RESOURCE, so runc cannot write the
# negative oom_score_adj (-998) that kubelet asks for sandboxes, and fails with "can't get final
# child's PID from pipe: EOF". The wrapper clamps a negative oomScoreAdj in the bundle's spec to
# 0 and runs runc. It is used only where the capability is missing (see `node`).
write_runc_clamp() {
  cat > "$1" <<'EOF'
#!/bin/sh
bundle= prev=
for a in "$@"; do
  case $prev in --bundle | -b) bundle=$a ;; esac
  case $a in --bundle=*) bundle=${a#--bundle=} ;; esac
  prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  sed -i 's/"oomScoreAdj":-[0-9]*/"oomScoreAdj":0/' "$bundle/config.json"
fi
exec /usr/sbin/runc "$@"
EOF
  chmod +x "$1"
}

# --- keepers: outside, one per piece ----------------------------------------------------------

# Starts `cluster.sh _PIECE STATE [NAME]` as PID 1 of new PID, mount and network namespaces,
# under `setpriv --pdeathsig KILL` (it dies with the keeper that started it), and records its
# host PID (the PID 1 inside) in DIR/ns-pid.
spawn() { # dir cgroup piece args...
  local dir=$1 cg=$2
  shift 2
  rm -f "$dir/ns-pid"
  setpriv --pdeathsig KILL unshare --pid --mount --net --fork --kill-child --mount-proc --propagation private \
    env CGROUP_ROOT="$cg" NODES="$NODES" bash "$here/cluster.sh" "$@" &
  local starter=$! i pid=""
  for ((i = 0; i < 100; i++)); do
    pid=$(pgrep -P "$starter" 2>/dev/null | head -n 1) && [ -n "$pid" ] && break
    sleep 0.05
  done
  [ -n "$pid" ] || die "$* did not start"
  echo "$pid" > "$dir/ns-pid"
  SPAWNED=$starter
}

# One node's keeper: boots the node, and boots it again each time `start` asks after a crash.
# The node is its child (pdeathsig): whatever kills the keeper kills the node.
node_keeper() { # state name
  S=$1
  NODES=$(cat "$S/node-count")
  local name=$2 i dir cg
  i=$(node_index "$name")
  dir=$S/nodes/$name
  cg=$(cat "$S/cgroup")/$name
  cgroup_create "$cg"
  while :; do
    rm -f "$dir/start-request"
    spawn "$dir" "$cg" _node "$S" "$name"
    # The node's end of its link, on the control plane's bridge. After a crash the kernel tears
    # the old pair down only once the node's network namespace is gone, which may be later than
    # this boot: the stale end is removed first, and the pair made again until it takes.
    local tries
    for ((tries = 0; tries < 50; tries++)); do
      nsenter --target "$(cat "$S/cp/ns-pid")" --net -- ip link del "gk-n$i" 2>/dev/null || true
      nsenter --target "$(cat "$S/cp/ns-pid")" --net -- \
        ip link add "gk-n$i" type veth peer name eth0 netns "$(cat "$dir/ns-pid")" 2>/dev/null && break
      sleep 0.1
    done
    nsenter --target "$(cat "$S/cp/ns-pid")" --net -- sh -c "ip link set gk-n$i master gk-br && ip link set gk-n$i up"
    wait "$SPAWNED" || true
    rm -f "$dir/ns-pid"
    log "$name is down"
    while [ ! -e "$dir/start-request" ]; do sleep 0.2; done
  done
}

cp_keeper() { # state
  S=$1
  NODES=$(cat "$S/node-count")
  local cg
  cg=$(cat "$S/cgroup")/control-plane
  cgroup_create "$cg"
  spawn "$S/cp" "$cg" _cp "$S"
  wait "$SPAWNED" || true
}

# --- outside ---------------------------------------------------------------------------------

prepare() { # STATE IMAGES_DIR
  S=$1
  binaries
  mkdir -p "$S/bin" "$S/images" "$S/cp"
  S=$(cd "$S" && pwd)
  local kubectl=${KUBECTL:-$root/.tools/bin/kubectl}
  [ -x "$kubectl" ] || kubectl=$(command -v kubectl) || die "no kubectl: run bash .ci/tools.sh"
  ln -sf "$kubectl" "$S/bin/kubectl"
  local helm=${HELM:-$root/.tools/bin/helm}
  [ -x "$helm" ] && ln -sf "$helm" "$S/bin/helm"
  pki "$S/pki"
  kubeconfig "$S/admin.kubeconfig" "https://$CP_IP4:6443" admin
  local i n
  for ((i = 1; i <= NODES; i++)); do
    n=$(node_name "$i")
    mkdir -p "$S/nodes/$n"
    kubeconfig "$S/nodes/$n/kubelet.kubeconfig" "https://$CP_IP4:6443" "kubelet-$n"
  done
  echo "nameserver $DNS_IP" > "$S/resolv.conf"
  echo "$NODES" > "$S/node-count"
  write_runc_clamp "$S/runc-clamp-oom"
  if [ -n "${2:-}" ]; then cp "$2"/*.tar "$S/images/" 2>/dev/null || true; fi
  [ -f "$S/images/pause.tar" ] || bash "$here/images.sh" pause "$S/images" >/dev/null
}

# The whole cluster, from a keeper process of its own (its host PID names the cgroup root). Each
# piece has a keeper process of its own too, each under `setpriv --pdeathsig KILL` of the one
# above it, so the chain from the caller down to every container breaks at no link.
keeper() { # state
  S=$1
  NODES=$(cat "$S/node-count")
  echo "$BASHPID" > "$S/keeper-pid"
  cgroup_sweep
  echo "$(cgroup_base)/cluster-$BASHPID" > "$S/cgroup"
  trap 'kill -KILL $(jobs -p) 2>/dev/null; exit 0' TERM INT
  setpriv --pdeathsig KILL bash "$here/cluster.sh" _cp_keeper "$S" &
  local i
  for ((i = 0; i < 600; i++)); do [ -e "$S/cp/started" ] || [ -e "$S/cp/broken" ] && break; sleep 0.1; done
  for ((i = 1; i <= NODES; i++)); do
    setpriv --pdeathsig KILL bash "$here/cluster.sh" _node_keeper "$S" "$(node_name "$i")" &
  done
  wait
}

start() { # STATE [setpriv/setsid args...]
  local s=$1
  shift
  "$@" bash "$here/cluster.sh" _keeper "$s" &
  disown
  wait_up "$s"
}

ready_nodes() { # state
  in_cp "$1" "$1/bin/kubectl" get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null \
    | awk '$2 == "True"' | wc -l
}

# Until every node is Ready and the default ServiceCIDR, the kubernetes Service and a default
# ServiceAccount exist: what a `helm install` needs.
wait_up() {
  local s=$1 i t0=$SECONDS n
  n=$(cat "$s/node-count")
  for ((i = 0; i < 480; i++)); do
    if [ -e "$s/cp/broken" ] || compgen -G "$s/nodes/*/broken" >/dev/null; then
      tail -n 20 "$s"/cp/logs/*.log "$s"/nodes/*/logs/*.log >&2 || true
      die "the cluster broke while starting"
    fi
    if [ -e "$s/cp/started" ] && [ "$(ready_nodes "$s")" = "$n" ] \
      && in_cp "$s" "$s/bin/kubectl" -n default get serviceaccount default >/dev/null 2>&1; then
      log "$n nodes Ready after $((SECONDS - t0)) s; state in $s"
      return 0
    fi
    sleep 0.5
  done
  tail -n 30 "$s"/nodes/*/logs/kubelet.log >&2 || true
  die "the cluster's $n nodes not Ready after 240 s (logs in $s/nodes/*/logs)"
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

crash() { # state name
  local s=$1 name=$2 pid
  pid=$(cat "$s/nodes/$name/ns-pid" 2>/dev/null) || die "$name is not running"
  # SIGKILL to a PID namespace's init kills every process in it and in the namespaces nested
  # in it (the containers): a power cut, as far as the rest of the cluster can tell.
  kill -KILL "$pid"
  local i
  for ((i = 0; i < 100; i++)); do [ -e "$s/nodes/$name/ns-pid" ] || break; sleep 0.1; done
  [ ! -e "$s/nodes/$name/ns-pid" ] || die "$name did not go down"
}

boot() { # state name
  local s=$1 name=$2 i t0=$SECONDS since
  [ ! -e "$s/nodes/$name/ns-pid" ] || die "$name is running"
  since=$(date -u +%s)
  touch "$s/nodes/$name/start-request"
  # Ready as this boot's kubelet reports it: a heartbeat no older than the boot (the Node may
  # still say Ready from before a crash the node controller has not noticed yet).
  local ready
  for ((i = 0; i < 240; i++)); do
    ready=$(in_cp "$s" "$s/bin/kubectl" get node "$name" \
      -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}' 2>/dev/null) || ready=""
    if [ -e "$s/nodes/$name/started" ] && [ "${ready%% *}" = True ] \
      && [ "$(date -u -d "${ready#* }" +%s)" -ge "$since" ]; then
      log "$name Ready $((SECONDS - t0)) s after its boot"
      return 0
    fi
    sleep 0.5
  done
  die "$name not Ready 120 s after its boot (logs in $s/nodes/$name/logs)"
}

# kube-proxy in MODE on every node: each node is restarted (a fresh network namespace, so no
# rule of the other mode is left behind) and its kube-proxy starts in MODE.
proxy_mode() { # state mode
  local s=$1 mode=$2 n
  case $mode in iptables | nftables) ;; *) die "proxy-mode: iptables or nftables, not $mode" ;; esac
  echo "$mode" > "$s/proxy-mode"
  for n in $(cd "$s/nodes" && ls); do
    crash "$s" "$n"
    boot "$s" "$n"
  done
}

link() { # state name up|down
  in_cp "$1" ip link set "gk-n$(node_index "$2")" "$3"
}

stop() {
  local s=$1 pid
  if [ -f "$s/keeper-pid" ]; then
    pid=$(cat "$s/keeper-pid")
    # The pieces' PID 1s get a TERM to stop their daemons; the keepers' KILL then takes the rest.
    for f in "$s"/cp/ns-pid "$s"/nodes/*/ns-pid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true; done
    sleep 1
    pkill -KILL -P "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
    for f in "$s"/cp/ns-pid "$s"/nodes/*/ns-pid; do
      [ -f "$f" ] || continue
      for ((i = 0; i < 50; i++)); do kill -0 "$(cat "$f")" 2>/dev/null || break; sleep 0.1; done
    done
  fi
  cgroup_sweep
  # What the nodes' containerd and kubelet wrote is root-owned and may be large; it is ours.
  rm -rf "$s"
}

# What each piece costs: the RSS and CPU of the processes of its own PID namespace (a node's
# containerd, shims, kubelet and kube-proxy; not its pods, whose PID namespaces nest), CPU as a
# share of one core over SECONDS.
cost() { # state seconds
  python3 - "$1" "${2:-10}" <<'PY'
import glob, os, sys, time
state, secs = sys.argv[1], float(sys.argv[2])
tick = os.sysconf("SC_CLK_TCK")
def members(nspid):
    ns = os.readlink(f"/proc/{nspid}/ns/pid")
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{p}/ns/pid") == ns:
                out.append(p)
        except OSError:
            pass
    return out
def rss(p):
    try:
        return next(int(l.split()[1]) for l in open(f"/proc/{p}/status") if l.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0
def cpu(p):
    try:
        f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except OSError:
        return 0
pieces = [("control plane", f"{state}/cp")] + [(os.path.basename(d), d) for d in sorted(glob.glob(f"{state}/nodes/*"))]
procs = {}
for name, d in pieces:
    try:
        procs[name] = members(open(f"{d}/ns-pid").read().strip())
    except OSError:
        procs[name] = []
before = {n: sum(cpu(p) for p in ps) for n, ps in procs.items()}
time.sleep(secs)
for name, _ in pieces:
    ps = procs[name]
    used = (sum(cpu(p) for p in ps) - before[name]) / tick
    print(f"{name}: RSS {sum(rss(p) for p in ps) / 1024:.0f} MiB, CPU {100 * used / secs:.1f}% of a core")
PY
}

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
