# Helpers of the end-to-end suite (sourced by e2e/suite.sh). Everything runs inside the control
# plane's network namespace (on the bridge every node is on) with KUBECONFIG set by
# e2e/cluster.sh; CLUSTER_STATE is the cluster's state dir. Commands that read or change one
# node's kernel (conntrack, iptables-save) run in that node's namespace through `on_node`.

NS=${GK_NAMESPACE:-groundskeeper}
RELEASE=gk
CLUSTER_SH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh
# The node the single-node tests run on; the multi-node tests name the others.
NODE=gk-node-1
node_ip() { echo "172.30.0.$((10 + ${1##*-}))"; }
node_ip6() { echo "fd00:30::$((10 + ${1##*-}))"; }
NODE_IP=$(node_ip "$NODE")
all_nodes() { seq 1 "${NODES:-3}" | sed 's/^/gk-node-/'; }
# The node-agent's admin port on the host network: the chart's default (e2e/values.yaml keeps it).
AGENT_PORT=$(awk '/^nodeAgent:/{on=1; next} /^[a-zA-Z]/{on=0} on && /^  adminPort:/{print $2}' "$(dirname "${BASH_SOURCE[0]}")/../charts/groundskeeper/values.yaml")

# on_node NODE CMD...: CMD in NODE's network namespace (its conntrack table, its iptables).
on_node() {
  local n=$1
  shift
  nsenter --target "$(cat "$CLUSTER_STATE/nodes/$n/ns-pid")" --net -- "$@"
}
# NODE's kube-proxy DNAT rules in iptables-save's words, whatever kube-proxy's mode: its
# iptables and ip6tables nat tables, and its nftables ruleset. kube-proxy v1.36 in nftables mode
# writes each service's endpoints as one map, `dnat ip to numgen random mod 2 map { 0 : A . P,
# 1 : ... }` (ip6: `0 : fd00::5 . P`); a plain `dnat to A:P` is read too. Each target reads as
# `-j DNAT --to-destination A:P` (IPv6: `[A]:P`).
dnat_rules() { # node
  { on_node "$1" iptables-save -t nat; on_node "$1" ip6tables-save -t nat
    on_node "$1" nft list ruleset | grep 'dnat' \
      | grep -oE '[0-9a-fA-F:.]+ \. [0-9]+|dnat (ip6? )?to [0-9[][^ ]*' \
      | sed -E 's/^dnat (ip6? )?to /-j DNAT --to-destination /
        s/^([0-9.]+) \. ([0-9]+)$/-j DNAT --to-destination \1:\2/
        s/^([0-9a-fA-F:]+) \. ([0-9]+)$/-j DNAT --to-destination [\1]:\2/'; } 2>/dev/null || true
}
proxy_mode() { bash "$CLUSTER_SH" proxy-mode "$CLUSTER_STATE" "$1" >/dev/null 2>&1; }
# ctr_on NODE ...: that node's containerd.
ctr_on() {
  local n=$1
  shift
  ctr --address "$CLUSTER_STATE/nodes/$n/containerd.sock" -n k8s.io "$@"
}
# Faults on demand (e2e/cluster.sh): crash (processes and containers killed at once), boot
# (again, from its disk), cut (link down: a partition) and heal.
crash_node() { bash "$CLUSTER_SH" crash "$CLUSTER_STATE" "$1" >/dev/null 2>&1; }
boot_node() { bash "$CLUSTER_SH" start "$CLUSTER_STATE" "$1" >/dev/null 2>&1; }
cut_node() { bash "$CLUSTER_SH" cut "$CLUSTER_STATE" "$1"; }
heal_node() { bash "$CLUSTER_SH" heal "$CLUSTER_STATE" "$1"; }

k() { kubectl "$@"; }
# grep -q in a pipeline stops reading at its first match; the writer's SIGPIPE then fails the
# pipeline under pipefail, at random. `has` reads everything.
has() { grep "$@" >/dev/null; }
say() { echo "    $*"; }
fail() {
  echo "    FAIL: $*"
  return 1
}

# until SECONDS_MAX CMD...: CMD until it succeeds, polling every 0.25 s.
until_ok() {
  local max=$1 t0=$EPOCHREALTIME
  shift
  while ! "$@" >/dev/null 2>&1; do
    awk -v t0="$t0" -v now="$EPOCHREALTIME" -v max="$max" 'BEGIN { exit !(now - t0 > max) }' && return 1
    sleep 0.25
  done
}

# Seconds since t0 (from $EPOCHREALTIME), three decimals.
since() { awk -v t0="$1" -v now="$EPOCHREALTIME" 'BEGIN { printf "%.3f", now - t0 }'; }

cm_pods() { k -n "$NS" get pods -l app.kubernetes.io/component=controller-manager -o jsonpath='{.items[*].metadata.name}'; }
# The node-agent pod of NODE (default: the first node).
agent_pod() {
  k -n "$NS" get pods -l app.kubernetes.io/component=node-agent --field-selector "spec.nodeName=${1:-$NODE}" \
    -o jsonpath='{.items[0].metadata.name}'
}
agent_pods() { k -n "$NS" get pods -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[*].metadata.name}'; }
pod_node() { k -n "${2:-$NS}" get pod "$1" -o jsonpath='{.spec.nodeName}'; }

# The Lease holder's pod (the identity is the pod name plus a random suffix).
leader_pod() {
  local id
  id=$(k -n "$NS" get lease groundskeeper-controller-manager -o jsonpath='{.spec.holderIdentity}' 2>/dev/null) || return 1
  [ -n "$id" ] || return 1
  local p
  for p in $(cm_pods); do
    case $id in "$p"*) echo "$p"; return 0 ;; esac
  done
  return 1
}

# Both admin servers serve HTTPS with a certificate of their own (the chart's metrics.scheme)
# and /metrics only to an authorized caller: read as Prometheus scrapes them, with the metrics
# reader's token (scraper_token) and no check of the self-signed certificate.
SCHEME=https
url_host() { case $1 in *:*) echo "[$1]" ;; *) echo "$1" ;; esac; }
# kubectl-groundskeeper as an admin runs it (`kubectl groundskeeper ...`): the release build's,
# the binary the image ships.
plugin() { "${GK_PLUGIN:-${CARGO_TARGET_DIR:-$root/target}/release/kubectl-groundskeeper}" "$@"; }

# A pod's /metrics, at the pod's address (the control plane's namespace routes to every pod).
metrics() { # pod port
  local ip
  ip=$(k -n "$NS" get pod "$1" -o jsonpath='{.status.podIP}')
  # A replica of the previous chart version (the upgrade test) serves plain HTTP.
  http_get "$SCHEME://$(url_host "$ip"):$2/metrics" "$(scraper_token)" 2>/dev/null \
    || http_get "http://$(url_host "$ip"):$2/metrics" "$(scraper_token)"
}
metric() { # pod port series-prefix: the sum of the matching samples
  metrics "$1" "$2" | awk -v m="$3" 'index($0, m) == 1 { s += $NF } END { printf "%g\n", s + 0 }'
}
cm_metric() { metric "$1" 8080 "$2"; }

# GET URL with an optional bearer token; the body on stdout, the HTTP code of a refusal on
# stderr and exit 1. An https URL's certificate is not checked (the servers' own, self-signed,
# as kube-prometheus scrapes kube-controller-manager's).
http_get() { # url [token]
  python3 - "$1" "${2:-}" <<'PY'
import ssl, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1])
if sys.argv[2]:
    req.add_header("Authorization", "Bearer " + sys.argv[2])
try:
    with urllib.request.urlopen(req, timeout=5, context=ssl._create_unverified_context()) as r:
        sys.stdout.write(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, file=sys.stderr)
    sys.exit(1)
PY
}

# The node-agent serves /metrics only to an authorized caller (the chart's metricsAuth:
# kubernetes), as Prometheus would scrape it: a ServiceAccount bound to the chart's
# metrics-reader ClusterRole, its token.
scraper_token() {
  local f=$CLUSTER_STATE/scraper.token
  if [ ! -s "$f" ]; then
    k -n default create serviceaccount e2e-scraper >/dev/null 2>&1 || true
    k create clusterrolebinding e2e-scraper --clusterrole="$RELEASE-groundskeeper-metrics-reader" \
      --serviceaccount=default:e2e-scraper >/dev/null 2>&1 || true
    k -n default create token e2e-scraper --duration=2h > "$f"
  fi
  cat "$f"
}
agent_metric() {
  http_get "$SCHEME://$NODE_IP:$AGENT_PORT/metrics" "$(scraper_token)" \
    | awk -v m="$1" 'index($0, m) == 1 { s += $NF } END { printf "%g\n", s + 0 }'
}

# How many controller-manager replicas report themselves leader.
leaders_now() {
  local p n=0
  for p in $(cm_pods); do
    [ "$(k -n "$NS" get pod "$p" -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ] || continue
    [ "$(cm_metric "$p" groundskeeper_leader_election_is_leader 2>/dev/null)" = 1 ] && n=$((n + 1))
  done
  echo "$n"
}

rollout() {
  k -n "$NS" rollout status deployment/"$RELEASE"-groundskeeper-controller-manager --timeout=120s >/dev/null \
    && k -n "$NS" rollout status daemonset/"$RELEASE"-groundskeeper-node-agent --timeout=120s >/dev/null
}

# A namespace of the test's own, deleted when the suite ends.
new_namespace() {
  local n="e2e-$1-$RANDOM"
  k create namespace "$n" >/dev/null
  echo "$n"
}

# Where a pod's first container runs: "NODE PID CONTAINER_ID", the PID as the node's PID
# namespace numbers it (ctr reports it there), or "?" when it is not found.
pod_proc() {
  local pod=$1 ns=${2:-$NS} cid pid node
  cid=$(k -n "$ns" get pod "$pod" -o jsonpath='{.status.containerStatuses[0].containerID}' | sed 's|.*://||')
  node=$(pod_node "$pod" "$ns")
  pid=$(ctr_on "$node" tasks ls 2>/dev/null | awk -v c="$cid" '$1 == c { print $2 }')
  if [ -n "$pid" ]; then echo "$node $pid $cid"; else echo "?"; fi
}

# A process's memory as kubelet counts it and as ps does (e2e/memory.py): "WORKING_SET_KIB RSS_KIB
# PSS_KIB CGROUP", the working set being that of the process's memory cgroup; or "? WHY" when a
# figure can not be read. PID is the host's, or with NODE, as that node's PID namespace numbers it.
MEMORY_PY=${CLUSTER_SH%/*}/memory.py
proc_memory() { # pid [node]
  local out
  if [ -n "${2:-}" ]; then
    out=$(nsenter --target "$(cat "$CLUSTER_STATE/nodes/$2/ns-pid")" --pid --mount -- \
      python3 - "/proc/$1" < "$MEMORY_PY" 2>&1) || out="? $out"
  else
    out=$(python3 - "/proc/$1" < "$MEMORY_PY" 2>&1) || out="? $out"
  fi
  echo "$out"
}

# The host's PID of the process named COMM (as /proc/PID/comm has it) in the PID namespace of a
# piece of the test cluster (its control plane, a node), whose state directory is DIR: for
# upstream's daemons there, which run outside containerd. "?" when there is none.
piece_pid() { # dir comm
  local ns p
  ns=$(readlink "/proc/$(cat "$1/ns-pid")/ns/pid") || { echo "?"; return; }
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/pid" 2>/dev/null)" = "$ns" ] || continue
    [ "$(cat "$p/comm" 2>/dev/null)" = "$2" ] || continue
    echo "${p#/proc/}"
    return
  done
  echo "?"
}
