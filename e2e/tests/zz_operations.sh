# Day-2 operations: helm test, helm upgrade, logs, memory, helm uninstall (last: it takes the
# product away).

test_ops_helm_test() {
  "$HELM" test "$RELEASE" -n "$NS" --timeout 120s >/dev/null || fail "helm test failed"
}

test_ops_logs_one_line_per_decision() {
  local p
  p=$(leader_pod) || fail "no leader"
  # The ServiceCIDR and PodGC tests ran: each decision left one line naming its object.
  k -n "$NS" logs "$p" | grep -E 'servicecidr=' | has 'finalizer' || fail "no finalizer decision logged by the leader"
  k -n "$NS" logs "$p" | grep -E 'pod=' | has -i 'delet' || fail "no pod deletion logged by the leader"
  # Plain logs carry plain values, not Rust's Debug (Some(..), quoted strings).
  ! k -n "$NS" logs "$p" | grep -E '=Some\(' | head -n 3 | grep . || fail "Debug formatting in the logs"
}

# Both admin servers (the node-agent's on the host network, each manager replica's on its pod):
# HTTPS only; /metrics refused without a token and to a token whose user may not read it,
# served to the metrics reader; the probes' endpoints stay open.
admin_server_is_https_and_guarded() { # host port
  local url=https://$(url_host "$1"):$2 code
  http_get "$url/readyz" >/dev/null || fail "$url/readyz is not open to the kubelet's probes"
  http_get "http://$(url_host "$1"):$2/healthz" >/dev/null 2>&1 && fail "$url answered in the clear"
  code=$(http_get "$url/metrics" 2>&1 >/dev/null) && fail "$url/metrics answered without a token"
  [ "$code" = 401 ] || fail "$url/metrics without a token: $code, not 401"
  k -n default create serviceaccount e2e-nobody >/dev/null 2>&1 || true
  code=$(http_get "$url/metrics" "$(k -n default create token e2e-nobody)" 2>&1 >/dev/null) && fail "$url/metrics answered a token without RBAC"
  [ "$code" = 403 ] || fail "$url/metrics with an unauthorized token: $code, not 403"
  http_get "$url/metrics" "$(scraper_token)" | has '^groundskeeper_' || fail "$url/metrics refused the metrics reader"
}
test_ops_metrics_need_https_and_an_authorized_token() {
  local p
  admin_server_is_https_and_guarded "$NODE_IP" "$AGENT_PORT"
  for p in $(cm_pods); do
    admin_server_is_https_and_guarded "$(k -n "$NS" get pod "$p" -o jsonpath='{.status.podIP}')" 8080
  done
}

# Idle memory of every replica and agent as kubelet counts it, beside upstream's on the same
# cluster (the control plane's kube-controller-manager, each node's kube-proxy): the working set
# of each one's memory cgroup (its container's; for upstream's, the cgroup of its own that
# e2e/cluster.sh runs each daemon in), as cAdvisor computes container_memory_working_set_bytes,
# with RSS and PSS for reference (e2e/memory.py). Idle: a minute with nothing asked of anyone,
# then each one's most over the next minute, sampled every 10 s: the top of its idle cycle, not
# one instant. The largest working set of each kind is a `bench` line. Figures, with no goal: the
# test fails only when one can not be read, or would be read from a cgroup not the process's own.
test_ops_idle_memory() {
  local p d key kind line node pid ws rss pss cg a b c i
  declare -A where=() own=() top=() group=() most=()
  mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
  measure_pod() { # kind pod
    local node pid cid
    read -r node pid cid <<<"$(pod_proc "$2")"
    [ -n "$cid" ] || { say "$2: its container's process not found"; return 1; }
    where["$1 $2"]="$pid $node"
    own["$1 $2"]="*/kubepods/*/$cid"
  }
  for p in $(cm_pods); do measure_pod controller_manager "$p" || return 1; done
  for p in $(agent_pods); do measure_pod node_agent "$p" || return 1; done
  pid=$(piece_pid "$CLUSTER_STATE/cp" kube-controller)
  where["kube_controller_manager control-plane"]=$pid
  own["kube_controller_manager control-plane"]="*/control-plane/daemons/kube-controller-manager"
  for d in "$CLUSTER_STATE"/nodes/*; do
    node=$(basename "$d")
    where["kube_proxy $node"]=$(piece_pid "$d" kube-proxy)
    own["kube_proxy $node"]="*/$node/daemons/kube-proxy"
  done
  for key in "${!where[@]}"; do
    case ${where[$key]} in '?'*) say "$key: process not found"; return 1 ;; esac
  done
  sleep 60
  for i in 1 2 3 4 5 6; do
    for key in "${!where[@]}"; do
      # shellcheck disable=SC2086 # "PID [NODE]": two words, or one.
      line=$(proc_memory ${where[$key]})
      read -r ws rss pss cg <<<"$line"
      [ "$ws" != "?" ] || { say "$key: $line"; return 1; }
      # shellcheck disable=SC2254 # own[] holds a pattern.
      case $cg in ${own[$key]}) ;; *) say "$key: its memory cgroup is $cg, not one of its own (${own[$key]})"; return 1 ;; esac
      read -r a b c <<<"${top[$key]:-0 0 0}"
      top[$key]="$((ws > a ? ws : a)) $((rss > b ? rss : b)) $((pss > c ? pss : c))"
      group[$key]=$cg
    done
    [ "$i" = 6 ] || sleep 10
  done
  while read -r key; do
    read -r ws rss pss <<<"${top[$key]}"
    say "$key: at most over the idle minute: working set $(mib "$ws") MiB, RSS $(mib "$rss") MiB, PSS $(mib "$pss") MiB (memory cgroup ${group[$key]})"
    kind=${key%% *}
    [ -n "${most[$kind]:-}" ] && [ "${most[$kind]}" -ge "$ws" ] || most[$kind]=$ws
  done < <(printf '%s\n' "${!top[@]}" | sort)
  for kind in controller_manager node_agent kube_controller_manager kube_proxy; do
    [ -n "${most[$kind]:-}" ] || { say "no $kind measured"; return 1; }
    echo "bench idle_working_set_$kind $(mib "${most[$kind]}") MiB"
  done
}

# What the test cluster itself costs, per node and for the control plane, with the chart
# installed and idle (README: the multi-node cluster).
test_ops_cluster_cost() {
  bash "$CLUSTER_SH" cost "$CLUSTER_STATE" 10 | sed 's/^/    cluster cost: /'
}

test_ops_helm_upgrade_one_leader_throughout() {
  "$HELM" upgrade "$RELEASE" "$root/charts/groundskeeper" -n "$NS" -f "$here/values.yaml" \
    --set logLevel=info >/dev/null || fail "helm upgrade"
  never_two_leaders 25
  rollout || fail "the upgrade did not roll out"
  until_ok 30 leader_pod || fail "no leader after the upgrade"
}

# helm upgrade from the previous chart version (docs/upgrade.md: the chart at PREV_CHART_REF, the
# last commit before its names, labels and CRD template changed): down to it, then up again, one
# leader throughout both rollouts, and work that comes due while the leader changes hands is
# done after it.
test_ops_helm_upgrade_from_previous_version() {
  local ref=${PREV_CHART_REF:-4c8b12f367f96c64fecc0c5611b5cc516cab8a45} dir ns i
  # As charts/check.sh does: a clone without that commit (shallow, or no git) skips, visibly.
  if ! git -C "$root" cat-file -e "$ref^{commit}" 2>/dev/null; then
    # Under CI a skip would hide that the upgrade path was never tried: fail instead.
    [ "${CI:-}" != true ] || fail "the previous chart version ($ref) is not in this clone (git fetch --unshallow); CI may not skip"
    say "SKIPPED: the previous chart version ($ref) is not in this clone (git fetch --unshallow)"
    return 0
  fi
  dir=$(mktemp -d)
  git -C "$root" archive "$ref" charts/groundskeeper | tar -x -C "$dir" \
    || fail "could not extract the previous chart version ($ref)"
  # That chart's tests.image.repository carries the registry (its schema has no registry key).
  sed '/^    registry: gk.local$/d; s|^    repository: tools$|    repository: gk.local/tools|' "$here/values.yaml" > "$dir/prev-values.yaml"
  "$HELM" upgrade "$RELEASE" "$dir/charts/groundskeeper" -n "$NS" -f "$dir/prev-values.yaml" >/dev/null \
    || fail "helm upgrade to the previous chart version"
  never_two_leaders 25
  rollout || fail "the previous chart version did not roll out"
  until_ok 30 leader_pod || fail "no leader on the previous chart version"
  "$HELM" upgrade "$RELEASE" "$root/charts/groundskeeper" -n "$NS" -f "$here/values.yaml" >/dev/null \
    || fail "helm upgrade from the previous chart version"
  # Terminated pods over the threshold (e2e/values.yaml: 10) made during the rollout.
  ns=$(new_namespace upgrade)
  for i in $(seq -w 1 14); do
    k -n "$ns" run "done-upgrade-$i" --image=gk.local/tools:1 --restart=Never --labels=e2e=terminated --command -- sh -c "exit 0" >/dev/null
  done
  never_two_leaders 20
  rollout || fail "the upgrade from the previous chart version did not roll out"
  until_ok 30 leader_pod || fail "no leader after the upgrade from the previous chart version"
  until_ok 120 sh -c "[ \$(kubectl -n $ns get pods -l e2e=terminated --no-headers | wc -l) -le 10 ]" \
    || fail "terminated pods made during the upgrade were not brought down to the threshold"
  k delete namespace "$ns" --wait=false >/dev/null
  rm -rf "$dir"
}

# Pods of the real node that groundskeeper had no reason to touch were not: every pod delete it
# made is of a test's garbage (an orphan or a terminated pod), none of a running pod.
test_ops_audit_no_running_pod_deleted() {
  local audit=$CLUSTER_STATE/cp/logs/audit.log
  python3 - "$audit" <<'PY' || fail "groundskeeper deleted pods it must not have"
import json, sys
bad, n = [], 0
for line in open(sys.argv[1]):
    e = json.loads(line)
    u = e.get("user", {}).get("username", "")
    r = e.get("objectRef", {})
    if e.get("verb") == "delete" and r.get("resource") == "pods" and u.startswith("system:serviceaccount:groundskeeper:"):
        n += 1
        ok = r.get("name", "").startswith(("orphan", "done-"))
        if not ok:
            bad.append(f'{r.get("namespace")}/{r.get("name")} by {u}')
        elif r.get("name") in ("alive", "runner"):
            bad.append(f'{r.get("namespace")}/{r.get("name")} (running) by {u}')
print("    pod deletes by groundskeeper:", n)
for b in bad:
    print("    deleted:", b)
sys.exit(1 if bad else 0)
PY
}

test_zz_ops_helm_uninstall_leaves_nothing() {
  "$HELM" uninstall "$RELEASE" -n "$NS" --wait --timeout 120s >/dev/null || fail "helm uninstall"
  until_ok 60 sh -c "[ -z \"\$(kubectl -n $NS get pods -o name)\" ]" || fail "pods left after uninstall"
  local left
  left=$(k get clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings -o name | grep groundskeeper || true)
  [ -z "$left" ] || fail "left after uninstall: $left"
  ! k -n "$NS" get lease groundskeeper-controller-manager >/dev/null 2>&1 || fail "the Lease is left after uninstall"
  local fin
  fin=$(k get servicecidrs -o jsonpath='{range .items[*]}{.metadata.name}: {.metadata.finalizers}{"\n"}{end}' | grep service-cidr-finalizer || true)
  [ -z "$fin" ] || fail "ServiceCIDR finalizers left after uninstall: $fin"
  # A ServiceCIDR can still be deleted, and the namespace too.
  local cidr=e2e-after-$RANDOM
  k apply -f - >/dev/null <<Y
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: $cidr}
spec: {cidrs: ["10.98.0.0/24"]}
Y
  k delete servicecidr "$cidr" --timeout=30s >/dev/null || fail "a ServiceCIDR cannot be deleted after uninstall"
  k delete namespace "$NS" --timeout=60s >/dev/null || fail "the release namespace cannot be deleted after uninstall"
}
