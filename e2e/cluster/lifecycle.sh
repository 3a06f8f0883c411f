# shellcheck shell=bash disable=SC2154 # here and root are e2e/cluster.sh's
# The cluster's life, from outside: its state prepared (binaries, PKI, kubeconfigs, images),
# started and waited for until every node is Ready, and stopped with all it left removed; and
# what each piece costs. Sourced by e2e/cluster.sh.

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
