# shellcheck shell=bash disable=SC2154 # bin is e2e/cluster.sh's
# PID 1 of the control plane (`cluster.sh _cp STATE`), in namespaces of its own: the bridge the
# nodes' links join, etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and the
# cluster DNS (dnsmasq). Sourced by e2e/cluster.sh.

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
