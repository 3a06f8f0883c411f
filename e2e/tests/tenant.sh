# Enforce against a tenant: a namespace user with the built-in `edit` role (kubectl --as,
# a RoleBinding in their namespace) tries every path a pod has to a node while every replica is
# up, one is down, and every one is down. Under an Enforce SysctlPolicy that forbids
# kernel.msgmax on every node (the kubelets allow it: a pod that got through would run), none of
# their forbidden pods may run, and their ordinary pods are scheduled throughout.

# As the tenant: kubectl --as tenant.
tk() { kubectl --as=tenant "$@"; }

# A pod of the tenant's that sets kernel.msgmax; extra spec lines (indented) after "spec:".
tenant_pod() { # ns name [spec-lines] [annotations-map]
  cat <<Y
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: $1, labels: {e2e: tenant}, annotations: ${4:-{\}}}
spec:
${3:-}
  terminationGracePeriodSeconds: 0
  securityContext: {sysctls: [{name: kernel.msgmax, value: "65536"}]}
  containers: [{name: c, image: gk.local/tools:1, command: [sleep, "3600"]}]
Y
}

# An ordinary pod of the tenant's (no sysctl), by the scheduler or on NODE.
tenant_plain() { # ns name [node]
  cat <<Y
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: $1, labels: {e2e: plain}}
spec:
  ${3:+nodeName: $3}
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: gk.local/tools:1, command: [sleep, "3600"]}]
Y
}

cm_replicas() { # n: scale the controller-manager and wait for it
  local deploy=$RELEASE-groundskeeper-controller-manager
  k -n "$NS" scale deployment "$deploy" --replicas="$1" >/dev/null
  if [ "$1" = 0 ]; then
    until_ok 60 sh -c "[ -z \"\$(kubectl -n $NS get pods -l app.kubernetes.io/component=controller-manager -o name)\" ]"
  else
    until_ok 90 sh -c "[ \$(kubectl -n $NS get deployment $deploy -o jsonpath='{.status.readyReplicas}') = $1 ] && [ \$(kubectl -n $NS get pods -l app.kubernetes.io/component=controller-manager -o name | wc -l) = $1 ]"
  fi
}

test_multinode_tenant_sysctl_enforce() {
  local ns out down n=0 refused=0 ran_n=0 p plain=0 plain_want=0 paths=""
  ns=$(new_namespace tenant)
  trap 'kubectl delete sysctlpolicy e2e-tenant --ignore-not-found >/dev/null 2>&1; cm_replicas 2 >/dev/null 2>&1' EXIT
  k -n "$ns" create rolebinding tenant-edit --clusterrole=edit --user=tenant >/dev/null
  tk -n "$ns" auth can-i patch pods | has -x yes || fail "the tenant can not patch pods: the RoleBinding did not take"
  # (can-i exits 1 for "no": read its answer, not its status.)
  out=$(tk -n "$ns" auth can-i create pods --subresource=binding 2>&1 || true)
  [ "$out" = no ] || fail "edit grants pods/binding ($out): a tenant could bind pods"
  enforce_policy e2e-tenant '["kernel.shm_rmid_forced"]'
  sleep 3

  # Created with every replica up: gated (no node admits kernel.msgmax), held.
  tenant_pod "$ns" held-0 | tk apply -f - >/dev/null || fail "the tenant could not create a gated pod"
  n=$((n + 1))
  until_ok 20 sh -c "kubectl -n $ns get pod held-0 -o jsonpath='{.spec.schedulingGates[*].name}' | grep -q groundskeeper.dev/sysctl" \
    || fail "held-0 was not gated"

  for down in 0 1 2; do
    cm_replicas $((2 - down)) || fail "the controller-manager did not scale to $((2 - down))"
    # (a) the gate taken off: refused by the apiserver itself, with the way to see why.
    if out=$(tk -n "$ns" patch pod held-0 --type=json -p '[{"op":"remove","path":"/spec/schedulingGates"}]' 2>&1); then
      fail "$down replicas down: the tenant removed the gate: $out"
    fi
    echo "$out" | has "kubectl groundskeeper why pod held-0" || fail "the refusal does not say how to see why: $out"
    refused=$((refused + 1))
    # (b) created on a node, skipping the scheduler and the gate.
    if out=$(tenant_pod "$ns" "named-$down" "  nodeName: $B" | tk apply -f - 2>&1); then
      fail "$down replicas down: a forbidden pod created with spec.nodeName was admitted: $out"
    fi
    n=$((n + 1)) refused=$((refused + 1))
    # (c) a new pod by the scheduler: gated while a replica answers, not created with none.
    if tenant_pod "$ns" "new-$down" | tk apply -f - >/dev/null 2>&1; then
      [ "$down" -lt 2 ] || fail "every replica down: a pod that sets kernel.msgmax was created (the gate fails open)"
    else
      [ "$down" -eq 2 ] || fail "$down replicas down: a pod that sets kernel.msgmax was refused"
      refused=$((refused + 1))
    fi
    n=$((n + 1))
    # (d) dressed as a static pod's mirror (kubelet's own annotation): never sent to the gate.
    if tenant_pod "$ns" "mirror-$down" "" "{kubernetes.io/config.mirror: x}" | tk apply -f - >/dev/null 2>&1; then :; else refused=$((refused + 1)); fi
    n=$((n + 1))
    # Ordinary pods, by the scheduler and on a node: never held.
    tenant_plain "$ns" "plain-$down" | tk apply -f - >/dev/null || fail "$down replicas down: an ordinary pod was refused"
    tenant_plain "$ns" "plain-on-$down" "$C" | tk apply -f - >/dev/null || fail "$down replicas down: an ordinary pod on a node was refused"
    plain_want=$((plain_want + 2))
    paths="$paths $down-down"
  done
  k -n "$ns" wait pod -l e2e=plain --for=condition=Ready --timeout=90s >/dev/null || fail "ordinary pods did not all run"
  plain=$(k -n "$ns" get pods -l e2e=plain --field-selector=status.phase=Running --no-headers | wc -l)
  cm_replicas 2 || fail "the controller-manager did not come back"
  rollout || fail "rollout"
  # Once back, the pods created meanwhile are judged and held, not let through.
  sleep 15
  for p in $(k -n "$ns" get pods -l e2e=tenant -o jsonpath='{.items[*].metadata.name}'); do
    ran "$ns" "$p" && ran_n=$((ran_n + 1))
  done
  echo "sysctl tenant: $ran_n of $n forbidden pods ran (gate removal refused, nodeName pods refused with every replica down, each with 0, 1 and 2 of 2 replicas down; new pods gated, or refused with every replica down; mirror-dressed pods never ran; no pods/binding for edit); $plain of $plain_want ordinary pods ran"
  k delete sysctlpolicy e2e-tenant >/dev/null
  k delete namespace "$ns" --wait=false >/dev/null
  [ "$ran_n" -eq 0 ] || fail "$ran_n forbidden pods of the tenant ran: $(k -n "$ns" get pods -o wide --no-headers 2>/dev/null | tr '\n' ';')"
  [ "$plain" -eq "$plain_want" ] || fail "only $plain of $plain_want ordinary pods ran"
}

# Ready of every controller-manager replica and node-agent, one word each.
readiness() {
  k -n "$NS" get pods -l 'app.kubernetes.io/component in (controller-manager,node-agent)' \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}'
}
restarts_of_product() {
  k -n "$NS" get pods -l 'app.kubernetes.io/component in (controller-manager,node-agent)' \
    -o jsonpath='{.items[*].status.containerStatuses[*].restartCount}' | tr ' ' '\n' | awk '{ s += $1 } END { print s + 0 }'
}

# A pod of the tenant's opens 500 silent connections to each replica's webhook and admin ports
# and to each node-agent's admin port, plus slow-header and slow-body connections, for 90 s.
# Meanwhile kubelet's probes keep every replica and agent Ready (sampled every 5 s), nothing
# restarts, and reviews the apiserver sends the webhook (server-side dry-run creates of a pod
# that names its node and sets a sysctl) all succeed; their p99 is printed.
test_multinode_tenant_slow_clients() {
  local ns targets="" p ip before after samples=0 unready=0 i t0 ms times="" failed_reviews=0 n=30
  ns=$(new_namespace slowclients)
  trap 'kubectl delete namespace '"$ns"' --wait=false >/dev/null 2>&1' EXIT
  k -n "$ns" create rolebinding tenant-edit --clusterrole=edit --user=tenant >/dev/null
  for p in $(cm_pods); do
    ip=$(k -n "$NS" get pod "$p" -o jsonpath='{.status.podIP}')
    targets="${targets:+$targets, }$ip:9443, $ip:8080"
  done
  for p in $(agent_pods); do
    ip=$(k -n "$NS" get pod "$p" -o jsonpath='{.status.podIP}')
    targets="${targets:+$targets, }$ip:9846"
  done
  before=$(restarts_of_product)
  tk -n "$ns" apply -f - >/dev/null <<Y
apiVersion: v1
kind: Pod
metadata: {name: attacker, namespace: $ns}
spec:
  terminationGracePeriodSeconds: 0
  restartPolicy: Never
  containers: [{name: c, image: gk.local/tools:1, command: [slow-clients, "500", "30", "90", $targets]}]
Y
  k -n "$ns" wait pod/attacker --for=condition=Ready --timeout=60s >/dev/null || fail "the attacker pod did not start"
  sleep 10
  for i in $(seq 1 "$n"); do
    t0=$EPOCHREALTIME
    if tenant_pod "$ns" "review-$i" "  nodeName: $A" | k create --dry-run=server -f - >/dev/null 2>"$CLUSTER_STATE/review.err"; then
      ms=$(awk -v t0="$t0" -v now="$EPOCHREALTIME" 'BEGIN { printf "%d", (now - t0) * 1000 }')
      times="$times $ms"
    else
      failed_reviews=$((failed_reviews + 1))
      say "review $i failed: $(head -c 300 "$CLUSTER_STATE/review.err")"
    fi
    if [ $((i % 2)) = 0 ]; then
      samples=$((samples + 1))
      readiness | has False && { unready=$((unready + 1)); say "not Ready at sample $samples: $(readiness)"; }
    fi
    sleep 2
  done
  say "attacker: $(k -n "$ns" logs attacker 2>/dev/null | tail -n 20 | tr '\n' ';' | cut -c1-600)"
  after=$(restarts_of_product)
  local p99
  p99=$(echo "$times" | tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { i = int(NR * 0.99 + 0.999); if (i < 1) i = 1; print a[i] + 0 }')
  k -n "$ns" get pod attacker -o jsonpath='{.status.phase}' | has -x 'Running\|Succeeded' || fail "the attacker did not run: $(k -n "$ns" logs attacker 2>&1 | tail -3)"
  say "$((samples - unready)) of $samples samples all Ready; $failed_reviews of $n reviews failed; targets: $targets"
  if [ "$unready" -eq 0 ]; then
    echo "slow clients: replicas Ready throughout, $((after - before)) restarts, review p99 $p99 ms with 500 silent connections"
  else
    echo "slow clients: replicas not Ready in $unready of $samples samples, $((after - before)) restarts, review p99 $p99 ms with 500 silent connections"
  fi
  echo "bench e2e_slow_clients_review_p99_ms $p99 ms"
  [ "$unready" -eq 0 ] || fail "$unready of $samples samples saw a replica or agent not Ready"
  [ "$after" -eq "$before" ] || fail "$((after - before)) restarts under the slow clients"
  [ "$failed_reviews" -eq 0 ] || fail "$failed_reviews of $n reviews failed under the slow clients"
}
