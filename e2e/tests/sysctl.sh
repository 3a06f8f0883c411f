# Sysctl admission against a real kubelet (e2e/node.sh's kubelet allows kernel.msg*).

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
  enforce_policy e2e-enforce '["kernel.shm_rmid_forced"]'
  sleep 2
  for i in $(seq 1 10); do sysctl_pod "$ns" "paced-$i" kernel.msgmax | k apply -f - >/dev/null; n=$((n + 1)); sleep 1; done
  for i in $(seq 1 20); do sysctl_pod "$ns" "burst-$i"  kernel.msgmax; echo ---; done | k apply -f - >/dev/null
  n=$((n + 20))
  sleep 20
  local unbound
  unbound=$(k -n "$ns" get pods -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}' | awk 'NF == 1' | wc -l)
  say "$unbound of $n forbidden pods left Pending and unbound (held by the scheduling gate: no node admits them)"
  k -n "$ns" get events --field-selector reason=NoNodeAdmitsSysctls -o jsonpath='{.items[0].note}' 2>/dev/null | cut -c1-200 | sed 's/^/    placement: /'
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

# Fail closed, narrowly: with every controller-manager replica down, a pod that sets sysctls is
# not created (the gate's webhook fails closed), and a pod that sets none is never sent to it:
# it schedules and runs as if groundskeeper were not installed.
test_sysctl_fail_closed_narrowly() {
  local ns i n=10 m=10 refused=0 ran_n=0 scheduled replicas deploy
  deploy=deployment/"$RELEASE"-groundskeeper-controller-manager
  ns=$(new_namespace sysctl-fail-closed)
  enforce_policy e2e-fail-closed '["kernel.shm_rmid_forced"]'
  replicas=$(k -n "$NS" get "$deploy" -o jsonpath='{.spec.replicas}')
  k -n "$NS" scale "$deploy" --replicas=0 >/dev/null
  until_ok 90 sh -c "[ -z \"\$(kubectl -n $NS get pods -l app.kubernetes.io/component=controller-manager -o name)\" ]" \
    || fail "the controller-manager pods did not go"
  for i in $(seq 1 $n); do
    sysctl_pod "$ns" "forbidden-$i" kernel.msgmax | k apply -f - >/dev/null 2>&1 || refused=$((refused + 1))
  done
  for i in $(seq 1 $m); do
    k apply -f - >/dev/null <<Y
apiVersion: v1
kind: Pod
metadata: {name: plain-$i, namespace: $ns, labels: {e2e: plain}}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: gk.local/tools:1, command: [sleep, "3600"]}]
Y
  done
  k -n "$ns" wait pod -l e2e=plain --for=condition=Ready --timeout=120s >/dev/null || say "not every ordinary pod became Ready"
  scheduled=$(k -n "$ns" get pods -l e2e=plain -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c . || true)
  for p in $(k -n "$ns" get pods -l e2e=sysctl -o jsonpath='{.items[*].metadata.name}'); do
    ran "$ns" "$p" && ran_n=$((ran_n + 1))
  done
  echo "sysctl fail-closed: $ran_n of $n forbidden pods ran with every webhook replica down ($refused refused at creation); $scheduled of $m other pods scheduled"
  k -n "$NS" scale "$deploy" --replicas="$replicas" >/dev/null
  rollout || fail "the controller-manager did not come back"
  k delete sysctlpolicy e2e-fail-closed >/dev/null
  [ "$ran_n" -eq 0 ] || fail "$ran_n of $n forbidden pods ran with every replica down"
  [ "$refused" -eq "$n" ] || fail "only $refused of $n pods that set sysctls were refused with every replica down"
  [ "$scheduled" -eq "$m" ] || fail "only $scheduled of $m ordinary pods were scheduled with every replica down"
  k delete namespace "$ns" --wait=false >/dev/null
}
