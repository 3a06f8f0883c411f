# shellcheck shell=bash disable=SC2154 # bin is e2e/cluster.sh's
# PID 1 of a node (`cluster.sh _node STATE NAME`), in namespaces of its own: its addresses and
# routes on the link its keeper gives it, private copies of the paths the daemons hard-code,
# containerd with the ptp CNI, kubelet and kube-proxy. Sourced by e2e/cluster.sh.

# CAP_SYS_RESOURCE is bit 24 of the effective set.
CAP_SYS_RESOURCE=24

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
