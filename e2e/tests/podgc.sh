# PodGC, against a real kubelet: pods of the real node are never touched.

# A pod bound to a Node object that has no kubelet; the Node goes: after the quarantine the
# pod is force-deleted. A pod of the real node, in the same namespace, stays.
test_podgc_orphan_force_deleted_after_quarantine() {
  local ns ghost=e2e-ghost-$RANDOM
  ns=$(new_namespace podgc)
  k apply -f - >/dev/null <<Y
apiVersion: v1
kind: Node
metadata: {name: $ghost}
Y
  k -n "$ns" apply -f - >/dev/null <<Y
apiVersion: v1
kind: Pod
metadata: {name: orphan}
spec:
  nodeName: $ghost
  containers: [{name: c, image: gk.local/tools:1, command: [sleep, "3600"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: alive}
spec:
  nodeName: $NODE
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: gk.local/tools:1, command: [sleep, "3600"]}]
Y
  k -n "$ns" wait pod/alive --for=condition=Ready --timeout=60s >/dev/null || fail "the live pod did not start"
  local t0
  k delete node "$ghost" >/dev/null
  t0=$EPOCHREALTIME
  until_ok 60 sh -c "! kubectl -n $ns get pod orphan" || fail "the orphaned pod is still there 60 s after its node went"
  say "orphaned pod deleted $(since "$t0") s after its Node (quarantine 10 s)"
  k -n "$ns" get pod alive -o jsonpath='{.status.phase}' | has -x Running || fail "the pod on the live node was touched"
  k -n "$ns" delete pod alive --wait=false >/dev/null
  k delete namespace "$ns" --wait=false >/dev/null
}

# Terminated pods over the threshold (10 in e2e/values.yaml) go, oldest first; running pods stay.
test_podgc_terminated_over_threshold_oldest_first() {
  local ns i
  ns=$(new_namespace terminated)
  k -n "$ns" apply -f - >/dev/null <<Y
apiVersion: v1
kind: Pod
metadata: {name: runner}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: gk.local/tools:1, command: [sleep, "3600"]}]
Y
  for i in $(seq -w 1 16); do
    k -n "$ns" run "done-$i" --image=gk.local/tools:1 --restart=Never --labels=e2e=terminated --command -- sh -c "exit 0" >/dev/null
    sleep 0.3
  done
  until_ok 120 sh -c "[ \$(kubectl get pods -A --field-selector=status.phase==Succeeded --no-headers | wc -l) -le 10 ] && [ \$(kubectl get pods -A --field-selector=status.phase==Failed --no-headers | wc -l) -eq 0 ] && [ \$(kubectl -n $ns get pods -l e2e=terminated --no-headers | wc -l) -le 10 ]" \
    || fail "terminated pods not brought down to the threshold: $(k get pods -A --field-selector=status.phase==Succeeded --no-headers | wc -l) Succeeded"
  local left
  left=$(k -n "$ns" get pods -l e2e=terminated -o jsonpath='{.items[*].metadata.name}' | tr ' ' '\n' | sort)
  say "left: $(echo $left)"
  # Oldest first: whatever stays is the newest of those created.
  local newest
  newest=$(seq -w 1 16 | sed 's/^/done-/' | tail -n "$(echo "$left" | grep -c .)")
  [ "$left" = "$newest" ] || fail "the pods kept are not the newest: kept $(echo $left), newest $(echo $newest)"
  k -n "$ns" get pod runner -o jsonpath='{.status.phase}' | has -x Running || fail "the running pod was touched"
  k delete namespace "$ns" --wait=false >/dev/null
}
