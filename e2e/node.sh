#!/usr/bin/env bash
# A real single-node Kubernetes v1.36.2 cluster inside namespaces of its own, for the end-to-end
# tests and for a person to explore: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd, kubelet and kube-proxy, all in one network, mount and PID
# namespace that this script creates.
#
#   node.sh run [--images DIR] -- CMD...   bring a node up, run CMD inside its network
#                                           namespace (KUBECONFIG set), tear down; CMD's status
#   node.sh up STATE [--images DIR]        bring a node up in the background, state in STATE
#   node.sh exec STATE -- CMD...           run CMD inside a running node's network namespace
#   node.sh load STATE IMAGE.tar...        import OCI archives into the node's containerd
#   node.sh down STATE                     stop it and remove what it left
#
# Why namespaces and not the host: nothing of the node may be reachable from, or routed to,
# anything outside it, and nothing may outlive it. Every daemon is a descendant of one PID 1
# (`unshare --pid --kill-child`, itself under `setpriv --pdeathsig KILL` in `run`), so when the
# caller dies, however it dies, the kernel kills the whole node: processes, containers (their
# PID namespaces nest in ours), the network namespace (unnamed: it dies with its last process)
# and every mount (the mount namespace is private). What the kernel cannot reap is swept here:
# empty cgroups under this node's cgroup root, at `down` and at the next start.
#
# The default paths that the daemons hard-code (/var/lib/kubelet, /var/log/pods, /run, ...) are
# bind mounts into STATE inside the private mount namespace, so the node never writes the
# machine's own.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
shared=${SHARED_BIN:-$root/../shared/bin}
target=${CARGO_TARGET_DIR:-$root/target}
bin=$target/e2e/bin
NODE_NAME=${NODE_NAME:-gk-node}
NODE_IP=172.30.0.2/24
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
DNS_IP=10.96.0.10
APISERVER_VIP=10.96.0.1
# CAP_SYS_RESOURCE is bit 24 of the effective set.
CAP_SYS_RESOURCE=24

die() { echo "node.sh: $*" >&2; exit 1; }
log() { echo "node.sh: $*" >&2; }

# --- binaries ------------------------------------------------------------------------------

# Unpacks shared/'s node tarball (checksum-checked, then each binary against the list in
# shared/bin/README.md) into target/e2e/bin, once.
binaries() {
  local tarball=$shared/kubernetes-node-v1.36.2-linux-amd64.tar.xz
  [ -f "$tarball" ] || die "$tarball is missing: the end-to-end tests need shared/'s Kubernetes node binaries"
  [ -x "$shared/kube-apiserver" ] || die "$shared/kube-apiserver is missing"
  if [ ! -f "$bin/.verified" ]; then
    (cd "$shared" && sha256sum --check --quiet kubernetes-node-v1.36.2-linux-amd64.tar.xz.sha256 kube-apiserver.sha256) \
      || die "shared/bin checksums do not match"
    rm -rf "$bin" && mkdir -p "$bin"
    tar -xJf "$tarball" -C "$bin"
    (cd "$bin" && sha256sum --check --quiet) <<'SUMS' || die "a node binary does not match shared/bin/README.md's checksum"
63ac78d21fd83be5f15ae385e3fa3c9d378b3eabe1610da906c9d9ab3bd7ab31  kube-controller-manager
7a5f6e679a7f4404e6620fd3d9e6df516b6ff72fcff9011dc8ed000f2942c7a8  kube-scheduler
5f89a97112a9b769433cf374117bbbe1d07eb3a13a349604435cf7ad28457882  kubelet
a51e15f78e4fa51a44ff79b94c72debb62d597b6fe1c539ffee42f108fe37759  kube-proxy
SUMS
    ln -sf "$(cd "$shared" && pwd)/kube-apiserver" "$bin/kube-apiserver"
    touch "$bin/.verified"
  fi
  local missing=()
  for c in containerd ctr runc iptables conntrack openssl catatonit setpriv unshare nsenter; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  [ -x /usr/bin/etcd ] || missing+=(etcd)
  [ -x /usr/lib/cni/ptp ] || missing+=(/usr/lib/cni/ptp)
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: apt-get install containerd runc iptables conntrack openssl catatonit util-linux etcd-server containernetworking-plugins (bash .ci/run does)"
}

# --- cgroups -------------------------------------------------------------------------------

# The node's cgroup root sits under this process's own memory cgroup, so the node's memory
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

# Removes the empty cgroups of nodes whose PID namespace is gone (named by the host PID that
# owned it); a cgroup that still holds a task is left alone, as rmdir refuses it.
cgroup_sweep() {
  local base h d
  base=$(cgroup_base)
  for h in /sys/fs/cgroup/*/; do
    for d in "${h%/}$base"/node-*; do
      [ -d "$d" ] && [ ! -e "/proc/${d##*/node-}" ] || continue
      find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  done
}

# --- PKI and kubeconfigs -------------------------------------------------------------------

pki() {
  local d=$1 ip=${NODE_IP%/*}
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
      "subjectAltName=IP:$ip,IP:$APISERVER_VIP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    cert admin "/O=system:masters/CN=groundskeeper-e2e-admin" "extendedKeyUsage=clientAuth\n"
    cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=clientAuth\n"
    cert kubelet-serving "/CN=$NODE_NAME" "subjectAltName=IP:$ip,DNS:$NODE_NAME\nextendedKeyUsage=serverAuth\n"
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

# --- inside: PID 1 of the node ---------------------------------------------------------------

wait_http() { # url what seconds
  local i
  for ((i = 0; i < $3 * 5; i++)); do
    curl_ok "$1" && return 0
    sleep 0.2
  done
  die "$2 did not answer $1 within $3 s (see $S/logs/)"
}

# No curl on a minimal machine: kubectl's raw GET stands in for the apiserver, bash's
# /dev/tcp for plain health ports.
curl_ok() {
  case $1 in
    apiserver) "$S/bin/kubectl" --kubeconfig "$S/admin.kubeconfig" get --raw /readyz >/dev/null 2>&1 ;;
    tcp:*) (exec 3<>"/dev/tcp/127.0.0.1/${1#tcp:}") 2>/dev/null ;;
  esac
}

daemon() { # name cmd...
  local name=$1
  shift
  "$@" >> "$S/logs/$name.log" 2>&1 &
  echo $! > "$S/pids/$name"
}

inside() {
  S=$1
  trap 'kill -TERM $(cat "$S"/pids/* 2>/dev/null) 2>/dev/null; exit 0' TERM INT
  mkdir -p "$S/logs" "$S/pids"
  local ip=${NODE_IP%/*}

  # Network: a veth pair with both ends inside (this kernel has no dummy links); the node IP on
  # the up end, the other end down, a default route so that kubelet and kube-proxy find "the"
  # interface. Nothing leaves: the peer is down and lives in this namespace too.
  ip link set lo up
  ip link add gk-node type veth peer name gk-peer
  ip addr add "$NODE_IP" dev gk-node
  ip link set gk-node up
  ip route add default dev gk-node
  sysctl -qw net.ipv4.ip_forward=1

  # Private copies of the paths the daemons hard-code.
  mount -t tmpfs -o mode=0755 tmpfs /run
  local m
  for m in /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/containerd /var/lib/cni /etc/cni/net.d /var/lib/kube-proxy /opt/containerd; do
    mkdir -p "$m" "$S/fs$m"
    mount --bind "$S/fs$m" "$m"
  done
  mkdir -p /run/containerd
  # Names resolve inside the node or not at all: the machine's resolver is not in this network.
  echo "nameserver ${NODE_IP%/*}" > "$S/host-resolv.conf"
  mount --bind "$S/host-resolv.conf" /etc/resolv.conf

  # etcd and kube-apiserver.
  daemon etcd /usr/bin/etcd --name e2e --data-dir "$S/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster e2e=http://127.0.0.1:2380 \
    --log-level warn --quota-backend-bytes 2147483648
  wait_http tcp:2379 etcd 30
  cat > "$S/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  verbs: [get, list, watch]
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}, {group: "", resources: [events]}]
  users: [system:kube-controller-manager, system:kube-scheduler, "system:node:gk-node"]
- level: Metadata
EOF
  local p=$S/pki
  daemon kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --advertise-address="$ip" --secure-port=6443 \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
    --kubelet-preferred-address-types=InternalIP --kubelet-client-certificate="$p/admin.crt" --kubelet-client-key="$p/admin.key" \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$p/sa.pub" \
    --service-account-signing-key-file="$p/sa.key" --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC --allow-privileged=true --enable-admission-plugins=NodeRestriction \
    --audit-policy-file="$S/audit-policy.yaml" --audit-log-path="$S/logs/audit.log" --audit-log-format=json \
    --audit-log-maxsize=0 --profiling=false -v=1
  wait_http apiserver kube-apiserver 60

  daemon kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$S/admin.kubeconfig" \
    --authentication-kubeconfig="$S/admin.kubeconfig" --authorization-kubeconfig="$S/admin.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --root-ca-file="$p/ca.crt" \
    --service-account-private-key-file="$p/sa.key" --use-service-account-credentials=true \
    --controllers='*,-pod-garbage-collector-controller,-service-cidr-controller' \
    --node-monitor-grace-period=20s -v=1
  daemon kube-scheduler "$bin/kube-scheduler" --kubeconfig="$S/admin.kubeconfig" \
    --authentication-kubeconfig="$S/admin.kubeconfig" --authorization-kubeconfig="$S/admin.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false -v=1

  # containerd, its own root, state and socket; CNI from /usr/lib/cni.
  local runtime=/usr/sbin/runc
  local caps
  caps=$(awk '/^CapEff/ {print $2}' /proc/self/status)
  if ((((0x$caps >> CAP_SYS_RESOURCE) & 1) == 0)); then
    runtime=$S/runc-clamp-oom
    write_runc_clamp "$runtime"
  fi
  cat > "$S/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$S/containerd.sock"
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
  # netfilter (kube-proxy's rules, the conntrack table the agent cleans).
  cat > /etc/cni/net.d/10-ptp.conflist <<EOF
{"cniVersion": "0.4.0", "name": "e2e", "plugins": [
  {"type": "ptp", "ipMasq": false, "mtu": 1500,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  daemon containerd containerd --config "$S/containerd.toml"
  local i
  for ((i = 0; i < 100; i++)); do [ -S "$S/containerd.sock" ] && break; sleep 0.1; done
  [ -S "$S/containerd.sock" ] || die "containerd did not start (see $S/logs/containerd.log)"
  local img
  for img in "$S"/images/*.tar; do
    [ -f "$img" ] && ctr --address "$S/containerd.sock" -n k8s.io images import --all-platforms "$img" >/dev/null
  done

  echo "nameserver $DNS_IP" > "$S/resolv.conf"
  cat > "$S/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$S/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $p/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $p/kubelet-serving.crt
tlsPrivateKeyFile: $p/kubelet-serving.key
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
  daemon kubelet "$bin/kubelet" --config="$S/kubelet.yaml" --kubeconfig="$S/kubelet.kubeconfig" \
    --node-ip="$ip" --hostname-override="$NODE_NAME" -v=1
  cat > "$S/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $S/admin.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
# nf_conntrack_max is read-only outside the host's root network namespace.
conntrack: {maxPerCore: 0, min: 0}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
  daemon kube-proxy "$bin/kube-proxy" --config="$S/kube-proxy.yaml" -v=1

  dns
  touch "$S/started"
  # PID 1 stays; when any daemon dies the node is broken, and saying so beats a hung test.
  while sleep 2; do
    for f in "$S"/pids/*; do
      kill -0 "$(cat "$f")" 2>/dev/null || { log "$(basename "$f") exited (see $S/logs/$(basename "$f").log)"; touch "$S/broken"; }
    done
  done
}

# Cluster DNS: dnsmasq behind the kube-dns Service, answering the cluster domain from a hosts
# file that a loop refreshes from the Service list (names of Services, not of pods).
dns() {
  local ip=${NODE_IP%/*} k="$S/bin/kubectl --kubeconfig $S/admin.kubeconfig"
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
  name: kube-dns-node
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: groundskeeper-e2e}
addressType: IPv4
endpoints: [{addresses: ["$ip"], conditions: {ready: true}}]
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
EOF
  : > "$S/dns-hosts"
  daemon dnsmasq dnsmasq --keep-in-foreground --no-resolv --no-hosts --addn-hosts="$S/dns-hosts" \
    --listen-address="$ip" --bind-interfaces --local=/cluster.local/ --pid-file= --user=root --log-facility=-
  local d
  d=$(cat "$S/pids/dnsmasq")
  (
    while sleep 1; do
      $k get svc -A -o jsonpath='{range .items[*]}{.spec.clusterIP} {.metadata.name}.{.metadata.namespace}.svc.cluster.local{"\n"}{end}' \
        2>/dev/null | grep -v '^None ' > "$S/dns-hosts.new" || continue
      cmp -s "$S/dns-hosts.new" "$S/dns-hosts" || { mv "$S/dns-hosts.new" "$S/dns-hosts"; kill -HUP "$d"; }
    done
  ) &
}

# Why this exists: this machine kind gives root no CAP_SYS_RESOURCE, so runc cannot write the
# negative oom_score_adj (-998) that kubelet asks for sandboxes, and fails with "can't get final
# child's PID from pipe: EOF". The wrapper clamps a negative oomScoreAdj in the bundle's spec to
# 0 and runs runc. It is used only where the capability is missing (see `inside`).
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

# --- outside ---------------------------------------------------------------------------------

prepare() { # STATE IMAGES_DIR
  S=$1
  binaries
  mkdir -p "$S/bin" "$S/images"
  S=$(cd "$S" && pwd)
  local kubectl=${KUBECTL:-$root/.tools/bin/kubectl}
  [ -x "$kubectl" ] || kubectl=$(command -v kubectl) || die "no kubectl: run bash .ci/tools.sh"
  ln -sf "$kubectl" "$S/bin/kubectl"
  local helm=${HELM:-$root/.tools/bin/helm}
  [ -x "$helm" ] && ln -sf "$helm" "$S/bin/helm"
  pki "$S/pki"
  kubeconfig "$S/admin.kubeconfig" "https://${NODE_IP%/*}:6443" admin
  kubeconfig "$S/kubelet.kubeconfig" "https://${NODE_IP%/*}:6443" kubelet
  if [ -n "${2:-}" ]; then cp "$2"/*.tar "$S/images/" 2>/dev/null || true; fi
  [ -f "$S/images/pause.tar" ] || bash "$here/images.sh" pause "$S/images" >/dev/null
}

start() { # STATE [setpriv args...]
  local s=$1
  shift
  cgroup_sweep
  # The node's PID 1 learns its host PID from $$ of the shell that execs unshare.
  "$@" bash -c 'echo $$ > "$1/host-pid"; exec unshare --pid --mount --net --fork --kill-child --mount-proc --propagation private env CGROUP_ROOT="$2/node-$$" bash "$3" _inside "$1"' \
    _ "$s" "$(cgroup_base)" "$here/node.sh" &
  local starter=$!
  # Its end is the node's end, reported by `stop`, not by the shell's job control.
  disown
  local i
  for ((i = 0; i < 50; i++)); do [ -s "$s/host-pid" ] && break; sleep 0.1; done
  cgroup_create "$(cgroup_base)/node-$(cat "$s/host-pid")"
  echo "$starter" > "$s/starter-pid"
  # The node's PID 1 is unshare's child; nsenter needs its host PID.
  for ((i = 0; i < 50; i++)); do
    NS_PID=$(pgrep -P "$(cat "$s/host-pid")" | head -n 1) && [ -n "$NS_PID" ] && break
    sleep 0.1
  done
  echo "$NS_PID" > "$s/ns-pid"
  wait_up "$s"
}

# Until the node is Ready and the default ServiceCIDR, the kubernetes Service and a default
# ServiceAccount exist: what a `helm install` needs.
wait_up() {
  local s=$1 i t0=$SECONDS
  for ((i = 0; i < 300; i++)); do
    [ -e "$s/broken" ] && { tail -n 20 "$s"/logs/*.log >&2; die "the node broke while starting"; }
    if [ -e "$s/started" ] && in_node "$s" "$s/bin/kubectl" get node "$NODE_NAME" \
      -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep True >/dev/null \
      && in_node "$s" "$s/bin/kubectl" -n default get serviceaccount default >/dev/null 2>&1; then
      log "node $NODE_NAME Ready after $((SECONDS - t0)) s; state in $s"
      return 0
    fi
    sleep 0.5
  done
  tail -n 30 "$s"/logs/kubelet.log >&2 || true
  die "node $NODE_NAME not Ready after 150 s (logs in $s/logs)"
}

# Runs a command in the node's network namespace (not its mount namespace: the caller's
# files stay in view), with the admin kubeconfig.
in_node() {
  local s=$1
  shift
  KUBECONFIG=$s/admin.kubeconfig PATH=$s/bin:$PATH nsenter --target "$(cat "$s/ns-pid")" --net -- "$@"
}

stop() {
  local s=$1 pid
  [ -f "$s/ns-pid" ] && pid=$(cat "$s/ns-pid") && kill -TERM "$pid" 2>/dev/null && sleep 1
  [ -f "$s/host-pid" ] && kill -KILL "$(cat "$s/host-pid")" 2>/dev/null || true
  [ -n "${pid:-}" ] && for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  cgroup_sweep
  # What the node's containerd and kubelet wrote is root-owned and may be large; it is ours.
  rm -rf "$s"
}

cmd=${1:-}
shift || true
case $cmd in
  _inside) inside "$@" ;;
  up)
    s=${1:?usage: node.sh up STATE [--images DIR]}
    imgs=""
    [ "${2:-}" = --images ] && imgs=$3
    prepare "$s" "$imgs"
    s=$(cd "$s" && pwd)
    # Detached: it stays up for a person after this shell goes; `node.sh down` stops it.
    start "$s" setsid </dev/null >>"$s/node.log" 2>&1 || { cat "$s/node.log" >&2; exit 1; }
    tail -n 1 "$s/node.log" >&2
    echo "export KUBECONFIG=$s/admin.kubeconfig   # use it inside the node: $0 exec $s -- kubectl get nodes"
    ;;
  exec)
    s=${1:?usage: node.sh exec STATE -- CMD...}
    shift
    [ "${1:-}" = -- ] && shift
    in_node "$(cd "$s" && pwd)" "$@"
    ;;
  load)
    s=${1:?usage: node.sh load STATE IMAGE.tar...}
    shift
    for img in "$@"; do
      ctr --address "$s/containerd.sock" -n k8s.io images import --all-platforms "$img" >/dev/null
    done
    ;;
  down) stop "${1:?usage: node.sh down STATE}" ;;
  run)
    imgs=""
    if [ "${1:-}" = --images ]; then imgs=$2; shift 2; fi
    [ "${1:-}" = -- ] && shift
    [ $# -gt 0 ] || die "usage: node.sh run [--images DIR] -- CMD..."
    s=$(mktemp -d "${TMPDIR:-/tmp}/gk-node.XXXXXX")
    trap 'stop "$s"' EXIT
    trap 'exit 130' INT TERM
    prepare "$s" "$imgs"
    # The node dies with this shell, however it dies.
    start "$s" setpriv --pdeathsig KILL
    set +e
    in_node "$s" env NODE_STATE="$s" "$@"
    rc=$?
    exit $rc
    ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
