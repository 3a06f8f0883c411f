#!/usr/bin/env bash
# The end-to-end tests: groundskeeper installed with `helm install` on a real cluster of several
# dual-stack nodes (e2e/cluster.sh) and tested the user's way, through its real pods, real
# kubelets, scheduler and kube-proxies. Runs inside the control plane's network namespace (e2e/run.sh
# starts it there). Each test_* function is one test; the last line is "N passed, M failed".
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
HELM=${HELM:-$root/.tools/bin/helm}
# shellcheck source=e2e/lib.sh
. "$here/lib.sh"
for t in "$here"/tests/*.sh; do
  # shellcheck source=/dev/null
  . "$t"
done

install_chart() {
  local t0=$EPOCHREALTIME
  "$HELM" install "$RELEASE" "$root/charts/groundskeeper" -n "$NS" --create-namespace \
    -f "$here/values.yaml" --wait --timeout 180s >/dev/null || fail "helm install" || return 1
  rollout || fail "rollout" || return 1
  say "chart Ready $(since "$t0") s after helm install"
  # A clean start says nothing alarming: no liveness failure, no restart. Readiness failures
  # are counted (the probe starts after 3 s: none on an idle node, one on a loaded one).
  local unhealthy restarts
  unhealthy=$(k -n "$NS" get events --field-selector reason=Unhealthy -o jsonpath='{range .items[*]}{.involvedObject.name}: {.message}{"\n"}{end}')
  say "probe failures at start: $(echo "$unhealthy" | grep -c . || true)"
  ! echo "$unhealthy" | has Liveness || fail "liveness probe failures at start: $unhealthy"
  restarts=$(k -n "$NS" get pods -o jsonpath='{.items[*].status.containerStatuses[*].restartCount}' | tr ' ' '\n' | awk '{ s += $1 } END { print s + 0 }')
  [ "$restarts" = 0 ] || fail "$restarts container restarts at start"
}

passed=0 failed=0 failed_names=()
run() {
  local name=$1 t0=$EPOCHREALTIME
  echo "--- $name"
  # Not in an `if`: bash ignores errexit in a condition, also inside the subshell, and a
  # test's first failed check must end it. A command that fails outside a check (no FAIL line of
  # its own) is named with its file and line.
  ( set -eE
    trap 'rc=$?; if [ "$BASH_SUBSHELL" = 1 ]; then case ${BASH_COMMAND%% *} in fail | return) ;;
      *) echo "    FAIL: exit $rc at ${BASH_SOURCE[0]##*/}:$LINENO in ${FUNCNAME[0]:-?}: $BASH_COMMAND" ;; esac; fi' ERR
    "$name" )
  local rc=$?
  if [ $rc -eq 0 ]; then
    passed=$((passed + 1))
    echo "ok  $name ($(since "$t0") s)"
  else
    failed=$((failed + 1))
    failed_names+=("$name")
    echo "FAILED $name ($(since "$t0") s, exit $rc)"
    # What a person would look at first.
    k -n "$NS" get pods -o wide 2>&1 | sed 's/^/    | /'
    for p in $(cm_pods) $(agent_pod); do
      k -n "$NS" logs "$p" --tail=15 2>&1 | sed "s/^/    | $p: /"
    done
  fi
}

# In this order: the leader tests replace the pods whose logs the log test reads, and uninstall
# takes the product away.
# The multi-node tests crash, cut and boot nodes: after the tests that read a quiet cluster
# (idle memory, the audit of every delete so far).
order="servicecidr podgc conntrack sysctl ops_helm_test ops_logs ops_metrics ops_idle_memory ops_cluster ops_audit multinode leader_delete leader_sigkill leader ops_helm_upgrade zz_"
all=$(declare -F | awk '{print $3}' | grep '^test_')
tests=""
for group in $order; do
  for t in $(echo "$all" | grep "^test_$group"); do
    case " $tests " in *" $t "*) ;; *) tests="$tests $t" ;; esac
  done
done
for t in $all; do case " $tests " in *" $t "*) ;; *) tests="$tests $t" ;; esac; done
[ -z "${E2E_TESTS:-}" ] || tests=$E2E_TESTS
# E2E_INSTALLED=1: the chart is already installed (a person re-running tests on `make cluster`).
[ -n "${E2E_INSTALLED:-}" ] || run install_chart
if [ "$failed" -eq 0 ]; then
  for t in $tests; do run "$t"; done
fi
echo
[ ${#failed_names[@]} -eq 0 ] || echo "failed: ${failed_names[*]}"
echo "e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
