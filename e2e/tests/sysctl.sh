# Sysctl admission against a real kubelet (e2e/cluster.sh's kubelets allow kernel.msg*).

sysctl_pod() { # ns name sysctl
  cat <<Y
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: $1, labels: {e2e: sysctl}}
spec:
  terminationGracePeriodSeconds: 0
  securityContext: {sysctls: [{name: $3, value: "65536"}]}
  containers: [{name: c, image: gk.local/tools:1, command: [sleep, "3600"]}]
Y
}

# An Enforce SysctlPolicy for every node allowing PATTERNS (a YAML list).
enforce_policy() { # name patterns
  k apply -f - >/dev/null <<Y
apiVersion: groundskeeper.dev/v1alpha1
kind: SysctlPolicy
metadata: {name: $1}
spec: {mode: Enforce, allowedUnsafeSysctls: $2}
Y
}

# Did kubelet start a container of this pod, ever?
ran() { # ns pod
  k -n "$1" get pod "$2" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}{.status.containerStatuses[0].state.terminated.startedAt}{.status.containerStatuses[0].lastState.terminated.startedAt}' 2>/dev/null | has .
}

test_sysctl_audit_fails_nothing() {
  local ns i
  ns=$(new_namespace sysctl-audit)
  # No SysctlPolicy: Audit. kernel.msgmax is not in the agent's allowlist, but kubelet's.
  for i in 1 2 3; do sysctl_pod "$ns" "audit-$i" kernel.msgmax | k apply -f - >/dev/null; done
  k -n "$ns" wait pod -l e2e=sysctl --for=condition=Ready --timeout=60s >/dev/null || fail "Audit: a pod did not run"
  sleep 3
  [ -z "$(k -n "$ns" get pods --field-selector=status.phase=Failed -o name)" ] || fail "Audit failed a pod"
  until_ok 20 sh -c "kubectl -n $ns get events --field-selector reason=SysctlForbidden -o name | grep -q ." \
    || fail "Audit: no SysctlForbidden Event for a pod with a forbidden sysctl"
  k delete namespace "$ns" --wait=false >/dev/null
}

test_sysctl_allowed_sysctl_runs_under_enforce() {
  local ns
  ns=$(new_namespace sysctl-allowed)
  enforce_policy e2e-allowed '["kernel.msgmax"]'
  sleep 2
  sysctl_pod "$ns" allowed kernel.msgmax | k apply -f - >/dev/null
  k -n "$ns" wait pod/allowed --for=condition=Ready --timeout=60s >/dev/null || fail "a pod with an allowed sysctl did not run"
  # A started pod survives the policy's removal (Enforce, nothing allowed any more).
  k delete sysctlpolicy e2e-allowed >/dev/null
  enforce_policy e2e-narrow '[]'
  sleep 5
  k -n "$ns" get pod allowed -o jsonpath='{.status.phase}' | has -x Running || fail "a running pod was touched after the policy changed"
  k delete sysctlpolicy e2e-narrow >/dev/null
  k delete namespace "$ns" --wait=false >/dev/null
}

# The measurement of the Enforce issue: of N forbidden pods, paced and in a burst, how many ran a
# container (the goal, met by the controller-manager's admission webhook refusing their
# binding to the node: 0); and no pod kubelet started is ever failed.
test_sysctl_enforce_measured() {
  local ns i n=0 ran_n=0 failed_started=0
  ns=$(new_namespace sysctl-enforce)
  # The policy goes with the test, pass or fail: it would forbid kernel.msgmax everywhere after.
  trap 'kubectl delete sysctlpolicy e2e-enforce --ignore-not-found >/dev/null 2>&1' EXIT
  enforce_policy e2e-enforce '["kernel.shm_rmid_forced"]'
  sleep 2
  for i in $(seq 1 10); do sysctl_pod "$ns" "paced-$i" kernel.msgmax | k apply -f - >/dev/null; n=$((n + 1)); sleep 1; done
  for i in $(seq 1 20); do sysctl_pod "$ns" "burst-$i"  kernel.msgmax; echo ---; done | k apply -f - >/dev/null
  n=$((n + 20))
  sleep 20
  local unbound
  unbound=$(k -n "$ns" get pods -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}' | awk 'NF == 1' | wc -l)
  say "$unbound of $n forbidden pods left Pending and unbound (held by the scheduling gate: no node admits them)"
  # The placement's Event says why (none may exist yet: a report, not a check).
  k -n "$ns" get events --field-selector reason=NoNodeAdmitsSysctls -o jsonpath='{.items[*].message}' 2>/dev/null \
    | cut -c1-200 | sed 's/^/    placement: /' || true
  echo
  # Created with its node already chosen: refused at creation, nothing to schedule.
  local out
  if out=$(sysctl_pod "$ns" direct kernel.msgmax | sed "s/^spec:/spec:\n  nodeName: $NODE/" | k apply -f - 2>&1); then
    fail "a forbidden pod created with spec.nodeName was admitted: $out"
  fi
  say "created with nodeName: $(echo "$out" | cut -c1-160)"
  for p in $(k -n "$ns" get pods -o jsonpath='{.items[*].metadata.name}'); do
    if ran "$ns" "$p"; then
      ran_n=$((ran_n + 1))
      [ "$(k -n "$ns" get pod "$p" -o jsonpath='{.status.phase}')" = Failed ] && failed_started=$((failed_started + 1))
    fi
  done
  echo "sysctl enforce: $ran_n of $n forbidden pods ran"
  k delete sysctlpolicy e2e-enforce >/dev/null
  [ "$failed_started" -eq 0 ] || fail "$failed_started pods that kubelet started were failed"
  [ "$ran_n" -eq 0 ] || fail "$ran_n of $n forbidden pods ran under Enforce"
  k delete namespace "$ns" --wait=false >/dev/null
}

