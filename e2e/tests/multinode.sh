# The promises that only happen across nodes, on the cluster of e2e/cluster.sh: a dead node's
# pods collected and nothing on the live nodes touched; a node shut down and tainted
# out-of-service; a leader whose node is cut off; flows from a client on one node to backends on
# others; IPv6 and dual-stack; the node-agent rolled node by node. Node A is gk-node-1 (the
# suite's own node), B and C the others. Every destructive test also says what must not be
# touched, on every node.

A=gk-node-1
B=gk-node-2
C=gk-node-3

# A pod pinned to NODE by spec.nodeName (no scheduling: the node is the point of the test).
pinned_pod() { # ns name node labels(yaml map) command(yaml list) [grace]
  cat <<Y
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: $1, labels: $4}
spec:
  nodeName: $3
  terminationGracePeriodSeconds: ${6:-1}
  containers: [{name: c, image: gk.local/tools:1, command: $5,
                readinessProbe: {exec: {command: [sh, -c, "true"]}, periodSeconds: 1}}]
---
Y
}

# UIDs of every pod on NODES (namespace/name=uid), to prove afterwards that none was touched.
pods_on() { # node...
  local n going
  # Pods already being deleted, or in a namespace being deleted (an earlier test's), are not
  # the live nodes' to keep.
  going=$(k get namespaces -o jsonpath='{range .items[?(@.status.phase=="Terminating")]}{.metadata.name}{"\n"}{end}')
  for n in "$@"; do
    k get pods -A --field-selector "spec.nodeName=$n" \
      -o go-template='{{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.namespace}}/{{.metadata.name}}={{.metadata.uid}}{{"\n"}}{{end}}{{end}}'
  done | sort | grep -v -F -f <(echo "$going" | grep . | sed 's|$|/|') || true
}

# Fails naming every pod of BEFORE (pods_on output) that is gone or was replaced.
still_there() { # before-list what
  local gone
  gone=$(comm -23 <(echo "$1" | grep . | sort) <(k get pods -A \
    -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort))
  [ -z "$gone" ] || fail "$2: $(echo "$gone" | tr '\n' ' ')"
}

# The audit log's pod writes by groundskeeper's controller-manager since T (RFC 3339), one
# line each: "verb ns/name[/subresource] code pod-of-the-writer".
audit_pod_writes_since() { # t
  python3 - "$CLUSTER_STATE/cp/logs/audit.log" "$1" "$NS" <<'PY'
import json, sys
path, since, ns = sys.argv[1:]
for line in open(path):
    e = json.loads(line)
    u = e.get("user", {})
    if not u.get("username", "").startswith(f"system:serviceaccount:{ns}:"):
        continue
    r = e.get("objectRef", {})
    if r.get("resource") != "pods" or e.get("verb") not in ("create", "update", "patch", "delete"):
        continue
    if e.get("requestReceivedTimestamp", "") < since:
        continue
    sub = "/" + r["subresource"] if r.get("subresource") else ""
    who = ",".join(u.get("extra", {}).get("authentication.kubernetes.io/pod-name", ["?"]))
    print(e["verb"], f'{r.get("namespace")}/{r.get("name")}{sub}', e.get("responseStatus", {}).get("code"), who)
PY
}
now_rfc3339() { date -u +%Y-%m-%dT%H:%M:%S.%6NZ; }

# Whatever a test did to the nodes is undone when it ends, pass or fail (each test runs in a
# subshell: `trap restore_nodes EXIT` there), so the next test starts from a whole cluster.
restore_nodes() {
  local n
  for n in $(all_nodes); do
    heal_node "$n" >/dev/null 2>&1 || true
    [ -s "$CLUSTER_STATE/nodes/$n/ns-pid" ] || boot_node "$n" || echo "    could not boot $n again"
  done
  # shellcheck disable=SC2046
  k uncordon $(all_nodes) >/dev/null 2>&1 || true
  k taint node --all node.kubernetes.io/out-of-service- >/dev/null 2>&1 || true
  k label node --all e2e-sysctl- >/dev/null 2>&1 || true
  k delete sysctlpolicy e2e-strict e2e-cut e2e-failclosed --ignore-not-found >/dev/null 2>&1 || true
}

# Waits until every node is Ready and the node-agent runs Ready on each: the state the next
# test starts from.
cluster_whole() {
  until_ok 180 sh -c "[ \$(kubectl get nodes --no-headers | grep -c ' Ready ') -eq ${NODES:-3} ]" || fail "not every node is Ready"
  rollout || fail "the chart's pods did not come back"
  until_ok 120 sh -c "[ \$(kubectl -n $NS get pods -l app.kubernetes.io/component=node-agent --field-selector status.phase=Running --no-headers | grep -c ' 1/1 ') -eq ${NODES:-3} ]" \
    || fail "the node-agent is not Ready on every node"
}

# A node killed and its Node deleted, as an autoscaler or a cloud controller does: its pods are
# orphans, force-deleted after the quarantine. Nothing on A or C is touched.
test_multinode_podgc_node_lost() {
  trap restore_nodes EXIT
  local ns before t0 tcut
  ns=$(new_namespace lost)
  {
    pinned_pod "$ns" lost-1 "$B" '{e2e: lost}' '[sleep, "3600"]'
    pinned_pod "$ns" lost-2 "$B" '{e2e: lost}' '[sleep, "3600"]'
    pinned_pod "$ns" keep-a "$A" '{e2e: keep}' '[sleep, "3600"]'
    pinned_pod "$ns" keep-c "$C" '{e2e: keep}' '[sleep, "3600"]'
  } | k apply -f - >/dev/null
  k -n "$ns" wait pod --all --for=condition=Ready --timeout=60s >/dev/null || fail "the test's pods did not start"
  before=$(pods_on "$A" "$C")
  tcut=$(now_rfc3339)
  crash_node "$B" || fail "could not crash $B"
  k delete node "$B" >/dev/null
  t0=$EPOCHREALTIME
  until_ok 60 sh -c "[ -z \"\$(kubectl -n $ns get pods -l e2e=lost -o name)\" ]" \
    || fail "the lost node's pods are still there 60 s after its Node went"
  say "the lost node's pods deleted $(since "$t0") s after its Node (quarantine 10 s, period 5 s)"
  still_there "$before" "pods on the live nodes $A and $C were deleted or replaced"
  # Every pod write groundskeeper made since the crash is of a pod that was on B.
  local writes bad
  writes=$(audit_pod_writes_since "$tcut")
  say "groundskeeper's pod writes since the crash: $(echo "$writes" | grep -c . || true)"
  bad=$(echo "$writes" | awk 'NF { print $2 }' | cut -d/ -f1,2 | sort -u | grep -Fx -f <(echo "$before" | sed 's/=.*//' | grep .) || true)
  [ -z "$bad" ] || fail "groundskeeper wrote pods of the live nodes: $bad"
  boot_node "$B" || fail "$B did not come back"
  cluster_whole
  k delete namespace "$ns" --wait=false >/dev/null
}

# Non-graceful node shutdown: B powered off (killed, its link gone with it), a StatefulSet pod on
# it, the admin taints B out-of-service. B's terminating pods are force-deleted, each first
# marked Failed with a DisruptionTarget condition as upstream does, and the StatefulSet pod runs
# on another node. After the taint goes and B is back, nothing more is deleted.
test_multinode_out_of_service_statefulset() {
  trap restore_nodes EXIT
  local ns before tcrash t0 node
  ns=$(new_namespace oos)
  # Only B schedulable while the StatefulSet's pod is placed: it lands on B, and may move later.
  k cordon "$A" "$C" >/dev/null
  k -n "$ns" apply -f - >/dev/null <<Y
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 30
      containers: [{name: c, image: gk.local/tools:1, command: [sleep, "3600"]}]
Y
  until_ok 60 sh -c "kubectl -n $ns get pod db-0 -o jsonpath='{.status.phase}' | grep -qx Running" \
    || { k uncordon "$A" "$C" >/dev/null; fail "the StatefulSet's pod did not start on $B"; }
  k uncordon "$A" "$C" >/dev/null
  [ "$(pod_node db-0 "$ns")" = "$B" ] || fail "db-0 is on $(pod_node db-0 "$ns"), not $B"
  pinned_pod "$ns" keep-a "$A" '{e2e: keep}' '[sleep, "3600"]' | k apply -f - >/dev/null
  k -n "$ns" wait pod/keep-a --for=condition=Ready --timeout=60s >/dev/null || fail "keep-a did not start"
  before=$(pods_on "$A" "$C")
  tcrash=$(now_rfc3339)
  crash_node "$B" || fail "could not crash $B"
  until_ok 60 sh -c "kubectl get node $B -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qv True" \
    || fail "$B is still Ready 60 s after its crash"
  k taint node "$B" node.kubernetes.io/out-of-service=nodeshutdown:NoExecute >/dev/null
  t0=$EPOCHREALTIME
  until_ok 90 sh -c "n=\$(kubectl -n $ns get pod db-0 -o jsonpath='{.spec.nodeName} {.status.phase}'); [ \"\${n#$B }\" = \"\$n\" ] && [ \"\${n#* }\" = Running ]" \
    || fail "db-0 is not Running on another node 90 s after the out-of-service taint: $(k -n "$ns" get pod db-0 -o wide --no-headers 2>&1)"
  node=$(pod_node db-0 "$ns")
  say "db-0 Running on $node $(since "$t0") s after the out-of-service taint"
  # Upstream's order: the status patch (Failed, DisruptionTarget) before the force delete.
  local writes
  writes=$(audit_pod_writes_since "$tcrash" | grep " $ns/db-0")
  echo "$writes" | sed 's/^/    audit: /'
  echo "$writes" | awk '($1 == "patch" || $1 == "update") && $2 ~ /\/status$/ && $3 < 300 { p = NR } $1 == "delete" && $3 < 300 { d = NR } END { exit !(p && d && p < d) }' \
    || fail "db-0 on $B was not marked Failed before its force delete"
  still_there "$before" "pods on the live nodes $A and $C were deleted or replaced"
  local tback
  k taint node "$B" node.kubernetes.io/out-of-service=nodeshutdown:NoExecute- >/dev/null
  tback=$(now_rfc3339)
  boot_node "$B" || fail "$B did not come back"
  cluster_whole
  sleep 10
  local after
  after=$(audit_pod_writes_since "$tback" | awk '$1 == "delete"')
  [ -z "$after" ] || fail "pods deleted after the taint went and $B came back: $after"
  k delete namespace "$ns" --wait=false >/dev/null
}

# The leader's node loses its link (a partition: the leader runs on, alone). A replica on
# another node takes over within the lease; the cut-off leader writes nothing after its term
# (the apiserver's audit log says so: it records every write that reaches it); when the link
# returns it rejoins as a follower.
test_multinode_leader_node_cut_off() {
  trap restore_nodes EXIT
  local old node others tcut t0 new
  until_ok 30 leader_pod || fail "no leader"
  old=$(leader_pod)
  node=$(pod_node "$old")
  others=$(for p in $(cm_pods); do [ "$p" = "$old" ] || pod_node "$p"; done | sort -u)
  echo "$others" | grep -v "^$node$" | has . || fail "no other controller-manager replica on another node than $node"
  tcut=$(now_rfc3339)
  t0=$EPOCHREALTIME
  cut_node "$node"
  until_ok 60 sh -c ". $here/lib.sh; p=\$(leader_pod) && [ \"\$p\" != $old ]" \
    || { heal_node "$node"; fail "no replica took over from $old within 60 s of its node's cut"; }
  new=$(leader_pod)
  say "$new (on $(pod_node "$new")) took over $(since "$t0") s after $old's node $node was cut off (lease 15 s)"
  sleep 5
  heal_node "$node"
  # Back on the network, the old leader follows.
  until_ok 60 sh -c ". $here/lib.sh; [ \"\$(cm_metric $old groundskeeper_leader_election_is_leader)\" = 0 ]" \
    || fail "$old does not say it follows 60 s after its link returned"
  [ "$(leader_pod)" = "$new" ] || fail "the lease moved again after the heal: $(leader_pod)"
  never_two_leaders 10
  # Writes by the old leader's pod that took effect after the cut: none may exist. (A lease
  # update it had in flight may arrive after the heal; the apiserver refuses it, 409.)
  local writes
  writes=$(python3 - "$CLUSTER_STATE/cp/logs/audit.log" "$tcut" "$old" <<'PY'
import json, sys
path, since, pod = sys.argv[1:]
n = 0
for line in open(path):
    e = json.loads(line)
    if e.get("requestReceivedTimestamp", "") < since or e.get("verb") not in ("create", "update", "patch", "delete"):
        continue
    if pod not in e.get("user", {}).get("extra", {}).get("authentication.kubernetes.io/pod-name", []):
        continue
    code = e.get("responseStatus", {}).get("code", 0)
    r = e.get("objectRef", {})
    # Reviews (a scraper's token checked for /metrics) are questions, not writes: no state changes.
    if r.get("resource") in ("tokenreviews", "subjectaccessreviews"):
        continue
    print(e["verb"], r.get("resource"), r.get("namespace"), r.get("name"), code)
PY
)
  echo "$writes" | grep . | sed 's/^/    old leader after the cut: /' || true
  local took
  took=$(echo "$writes" | awk 'NF && $NF < 300')
  [ -z "$took" ] || fail "the cut-off leader $old made writes after its term: $took"
  rollout || fail "the chart's pods are not Ready after the heal"
}

# A UDP server pod (udp-probe) pinned to NODE, labelled app=APP.
udp_server() { # ns name node app
  pinned_pod "$1" "$2" "$3" "{app: $4}" '[udp-probe, serve, "9000"]'
}
udp_client() { # ns name node target sport
  pinned_pod "$1" "$2" "$3" '{e2e: client}' "[udp-probe, send, \"$4\", \"$5\", \"50\"]" 0
}
# Until CLIENT's log shows an answer from SERVER.
answered_by() { # ns client server seconds
  until_ok "$4" sh -c "kubectl -n $1 logs $2 | grep -q 'answer $3\$'"
}
# Until NODE's kube-proxy DNATs to IP (port 9000), so a new flow can reach it.
programmed() { # node ip
  local i
  for ((i = 0; i < 400; i++)); do
    dnat_rules "$1" | has -- "--to-destination $2:9000\|--to-destination \[$2\]:9000" && return 0
    sleep 0.05
  done
  return 1
}
# Until POD's address has left every EndpointSlice of SERVICE.
left_slices() { # ns service pod
  until_ok 30 sh -c "! kubectl -n $1 get endpointslices -l kubernetes.io/service-name=$2 -o jsonpath='{range .items[*].endpoints[*]}{.targetRef.name} {end}' | grep -qw $3"
}

# A flow that is not kube-proxy's, on every node: it must outlive every test here.
BYSTANDER="-p udp -s 10.244.0.250 -d 10.244.0.251 --sport 4000 --dport 4001"
bystanders_in() {
  local n
  for n in $(all_nodes); do
    # shellcheck disable=SC2086
    on_node "$n" conntrack -I $BYSTANDER -t 600 -u ASSURED >/dev/null 2>&1 || true
  done
}
bystanders_still_there() {
  local n
  for n in $(all_nodes); do
    # shellcheck disable=SC2086
    on_node "$n" conntrack -L $BYSTANDER 2>/dev/null | has sport=4000 || fail "a flow that is not kube-proxy's was deleted on $n"
  done
}

# The switch: CLIENT's flow goes to OLD; NEW becomes serving, OLD is deleted; CLIENT must reach a
# live backend. Prints the lag from the moment the switch was due.
switch_backend() { # ns service client old new-ip-node
  local ns=$1 svc=$2 client=$3 old=$4 t_due first lag
  k -n "$ns" delete pod "$old" --wait=false >/dev/null
  left_slices "$ns" "$svc" "$old" || fail "$old did not leave the EndpointSlices"
  t_due=$((${EPOCHREALTIME/./} / 1000))
  answered_by "$ns" "$client" "$5" 15 || fail "$client did not reach the new backend $5 within 15 s of $old leaving"
  first=$(k -n "$ns" logs "$client" | awk -v s="$5" '$2 == "answer" && $3 == s { print $1; exit }')
  lag=$((first - t_due))
  say "$client: first answer from $5 ${lag} ms after $old left the EndpointSlice"
}

# A client on A, its backend on B. B's backend replaced by one on C: the client's flow leaves the
# dead backend and reaches the live one (kube-proxy itself clears a flow whose Service has
# another endpoint). Then C's backend goes too, with none left: kube-proxy v1.36 keeps such flows
# until an endpoint returns (kubernetes#139629), and A's agent deletes them; a backend back on B
# is reached. B's and C's tables hold the un-NATed half of the client's flows: not kube-proxy's
# there, left alone; and flows that are nobody's stay on every node.
test_multinode_conntrack_cross_node_backend_replaced() {
  local ns vip cip bip c_ip before after t0
  ns=$(new_namespace xnode)
  bystanders_in
  udp_server "$ns" server-b "$B" udp-x | k apply -f - >/dev/null
  k -n "$ns" apply -f - >/dev/null <<Y
apiVersion: v1
kind: Service
metadata: {name: udp-x}
spec:
  selector: {app: udp-x}
  ports: [{name: udp, port: 9000, protocol: UDP}]
Y
  k -n "$ns" wait pod/server-b --for=condition=Ready --timeout=60s >/dev/null || fail "server-b did not start"
  vip=$(k -n "$ns" get svc udp-x -o jsonpath='{.spec.clusterIP}')
  udp_client "$ns" client "$A" "$vip:9000" 5000 | k apply -f - >/dev/null
  k -n "$ns" wait pod/client --for=condition=Ready --timeout=60s >/dev/null || fail "the client did not start"
  answered_by "$ns" client server-b 20 || fail "the client never reached server-b"
  cip=$(k -n "$ns" get pod client -o jsonpath='{.status.podIP}')
  bip=$(k -n "$ns" get pod server-b -o jsonpath='{.status.podIP}')
  on_node "$B" conntrack -L -p udp -s "$cip" -d "$bip" 2>/dev/null | has dport=9000 || fail "no flow from the client on $B"
  udp_server "$ns" server-c "$C" udp-x | k apply -f - >/dev/null
  k -n "$ns" wait pod/server-c --for=condition=Ready --timeout=60s >/dev/null || fail "server-c did not start"
  c_ip=$(k -n "$ns" get pod server-c -o jsonpath='{.status.podIP}')
  programmed "$A" "$c_ip" || fail "$A's kube-proxy never programmed server-c"
  switch_backend "$ns" udp-x client server-b server-c
  on_node "$A" conntrack -L -p udp --reply-src "$bip" 2>/dev/null | has dport= && fail "$A still holds a flow to the deleted server-b"
  on_node "$B" conntrack -L -p udp -s "$cip" -d "$bip" 2>/dev/null | has dport=9000 \
    || fail "$B's agent deleted the un-NATed half of the client's flow (not kube-proxy's on $B)"
  # No endpoint left: A's agent's own work.
  before=$(agent_metric groundskeeper_conntrack_entries_deleted_total)
  k -n "$ns" delete pod server-c --wait=false >/dev/null
  left_slices "$ns" udp-x server-c || fail "server-c did not leave the EndpointSlices"
  for _ in $(seq 400); do dnat_rules "$A" | has -- "--to-destination $c_ip:" || break; sleep 0.05; done
  t0=$EPOCHREALTIME
  until_ok 15 on_node "$A" sh -c "! conntrack -L -p udp --reply-src $c_ip 2>/dev/null | grep -q dport=" \
    || fail "$A's flow to the removed server-c is still there 15 s after its Service lost its last endpoint"
  after=$(agent_metric groundskeeper_conntrack_entries_deleted_total)
  say "$A's flow to the last backend (on $C) gone $(since "$t0") s after it left; $A's agent deleted entries: $before -> $after"
  awk -v a="$after" -v b="$before" 'BEGIN { exit !(a > b) }' || fail "$A's agent's deletion counter did not move: something else removed the flow"
  on_node "$C" conntrack -L -p udp -s "$cip" -d "$c_ip" 2>/dev/null | has dport=9000 \
    || fail "$C's agent deleted the un-NATed half of the client's flow (not kube-proxy's on $C)"
  udp_server "$ns" server-b2 "$B" udp-x | k apply -f - >/dev/null
  answered_by "$ns" client server-b2 20 || fail "the client did not reach the backend back on $B"
  bystanders_still_there
  k delete namespace "$ns" --wait=false >/dev/null
}

# A NodePort reached through C's address from a client on A: C's table holds the NAT, C's agent
# cleans it. externalTrafficPolicy Cluster (backend on B, SNAT on C) and Local (backend on C).
test_multinode_conntrack_nodeport_through_another_node() {
  local ns policy backend_node np old new sport=5010
  ns=$(new_namespace nodeport)
  bystanders_in
  for policy in Cluster Local; do
    backend_node=$B
    [ "$policy" = Local ] && backend_node=$C
    old=np-${policy,,}-1
    new=np-${policy,,}-2
    udp_server "$ns" "$old" "$backend_node" "np-${policy,,}" | k apply -f - >/dev/null
    k -n "$ns" apply -f - >/dev/null <<Y
apiVersion: v1
kind: Service
metadata: {name: np-${policy,,}}
spec:
  type: NodePort
  externalTrafficPolicy: $policy
  selector: {app: np-${policy,,}}
  ports: [{name: udp, port: 9000, protocol: UDP}]
Y
    k -n "$ns" wait pod/"$old" --for=condition=Ready --timeout=60s >/dev/null || fail "$old did not start"
    np=$(k -n "$ns" get svc "np-${policy,,}" -o jsonpath='{.spec.ports[0].nodePort}')
    udp_client "$ns" "client-${policy,,}" "$A" "$(node_ip "$C"):$np" "$sport" | k apply -f - >/dev/null
    answered_by "$ns" "client-${policy,,}" "$old" 30 || fail "$policy: the client on $A never reached $old through $C:$np"
    on_node "$C" conntrack -L -p udp --dport "$np" 2>/dev/null | has "dport=$np" || fail "$policy: no NodePort flow in $C's table"
    udp_server "$ns" "$new" "$backend_node" "np-${policy,,}" | k apply -f - >/dev/null
    k -n "$ns" wait pod/"$new" --for=condition=Ready --timeout=60s >/dev/null || fail "$new did not start"
    programmed "$C" "$(k -n "$ns" get pod "$new" -o jsonpath='{.status.podIP}')" || fail "$C's kube-proxy never programmed $new"
    switch_backend "$ns" "np-${policy,,}" "client-${policy,,}" "$old" "$new"
    sport=$((sport + 1))
  done
  bystanders_still_there
  k delete namespace "$ns" --wait=false >/dev/null
}

# A localhost NodePort (iptables mode: kube-proxy DNATs 127.0.0.1:<nodePort>, route_localnet):
# a host-network client on A sends to 127.0.0.1:<nodePort>; its backend on B is replaced by one
# on C and the client's flow reaches the new one; the flow to the old backend does not stay.
# kube-proxy v1.36 in nftables mode serves no localhost NodePorts: there it is skipped, said.
test_multinode_conntrack_localhost_nodeport() {
  local ns np old_ip
  if [ "$(cat "$CLUSTER_STATE/proxy-mode" 2>/dev/null || echo iptables)" = nftables ]; then
    say "localhost NodePorts: not served by kube-proxy v1.36 in nftables mode, not tested there"
    return 0
  fi
  ns=$(new_namespace localnp)
  bystanders_in
  udp_server "$ns" lo-1 "$B" lo-np | k apply -f - >/dev/null
  k -n "$ns" apply -f - >/dev/null <<Y
apiVersion: v1
kind: Service
metadata: {name: lo-np}
spec:
  type: NodePort
  selector: {app: lo-np}
  ports: [{name: udp, port: 9000, protocol: UDP}]
Y
  k -n "$ns" wait pod/lo-1 --for=condition=Ready --timeout=60s >/dev/null || fail "lo-1 did not start"
  np=$(k -n "$ns" get svc lo-np -o jsonpath='{.spec.ports[0].nodePort}')
  udp_client "$ns" lo-client "$A" "127.0.0.1:$np" 5030 | sed 's/^spec:$/spec:\n  hostNetwork: true/' \
    | k apply -f - >/dev/null
  answered_by "$ns" lo-client lo-1 30 || fail "the host-network client on $A never reached lo-1 through 127.0.0.1:$np"
  on_node "$A" conntrack -L -p udp -d 127.0.0.1 --dport "$np" 2>/dev/null | has "dport=$np" \
    || fail "no localhost NodePort flow in $A's table"
  old_ip=$(k -n "$ns" get pod lo-1 -o jsonpath='{.status.podIP}')
  udp_server "$ns" lo-2 "$C" lo-np | k apply -f - >/dev/null
  k -n "$ns" wait pod/lo-2 --for=condition=Ready --timeout=60s >/dev/null || fail "lo-2 did not start"
  programmed "$A" "$(k -n "$ns" get pod lo-2 -o jsonpath='{.status.podIP}')" || fail "$A's kube-proxy never programmed lo-2"
  switch_backend "$ns" lo-np lo-client lo-1 lo-2
  until_ok 15 on_node "$A" sh -c "! conntrack -L -p udp -d 127.0.0.1 --dport $np --reply-src $old_ip 2>/dev/null | grep -q dport=" \
    || fail "$A's localhost NodePort flow to the removed lo-1 ($old_ip) is still there"
  bystanders_still_there
  k delete namespace "$ns" --wait=false >/dev/null
}

# The switch over an IPv6 ClusterIP: client on A, backend on B replaced by one on C.
test_multinode_ipv6_clusterip_backend_replaced() {
  local ns vip
  ns=$(new_namespace ipv6)
  udp_server "$ns" server-b "$B" udp6 | k apply -f - >/dev/null
  k -n "$ns" apply -f - >/dev/null <<Y
apiVersion: v1
kind: Service
metadata: {name: udp6}
spec:
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv6]
  selector: {app: udp6}
  ports: [{name: udp, port: 9000, protocol: UDP}]
Y
  k -n "$ns" wait pod/server-b --for=condition=Ready --timeout=60s >/dev/null || fail "server-b did not start"
  vip=$(k -n "$ns" get svc udp6 -o jsonpath='{.spec.clusterIP}')
  case $vip in *:*) ;; *) fail "the Service's ClusterIP $vip is not IPv6" ;; esac
  udp_client "$ns" client "$A" "[$vip]:9000" 5000 | k apply -f - >/dev/null
  answered_by "$ns" client server-b 30 || fail "the client never reached server-b over [$vip]"
  on_node "$A" conntrack -L -f ipv6 -p udp -d "$vip" 2>/dev/null | has dport=9000 || fail "no IPv6 flow to [$vip] in $A's table"
  udp_server "$ns" server-c "$C" udp6 | k apply -f - >/dev/null
  k -n "$ns" wait pod/server-c --for=condition=Ready --timeout=60s >/dev/null || fail "server-c did not start"
  programmed "$A" "$(k -n "$ns" get pod server-c -o jsonpath='{.status.podIPs[1].ip}')" || fail "$A's kube-proxy never programmed server-c over IPv6"
  switch_backend "$ns" udp6 client server-b server-c
  k delete namespace "$ns" --wait=false >/dev/null
}

# A dual-stack ServiceCIDR: the default one has both families, a finalizer and Ready; a second
# one with both families is held while an IPv6 address of it is allocated, released after.
test_multinode_dualstack_servicecidr() {
  local cidrs cidr=e2e-dual-$RANDOM ns t0
  cidrs=$(k get servicecidr kubernetes -o jsonpath='{.spec.cidrs}')
  { echo "$cidrs" | has ':' && echo "$cidrs" | has '\.'; } || fail "the default ServiceCIDR is not dual-stack: $cidrs"
  k get servicecidr kubernetes -o jsonpath='{.metadata.finalizers}' | has networking.k8s.io/service-cidr-finalizer \
    || fail "the default dual-stack ServiceCIDR has no finalizer"
  k apply -f - >/dev/null <<Y
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: $cidr}
spec: {cidrs: ["10.97.1.0/24", "fd00:10:97::/112"]}
Y
  until_ok 30 sh -c "kubectl get servicecidr $cidr -o jsonpath='{.metadata.finalizers}{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q 'finalizer.*True'" \
    || fail "$cidr: no finalizer or not Ready"
  ns=$(new_namespace dual)
  k -n "$ns" apply -f - >/dev/null <<Y
apiVersion: v1
kind: Service
metadata: {name: v6}
spec:
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv6]
  clusterIP: "fd00:10:97::10"
  ports: [{port: 80, protocol: TCP}]
Y
  k delete servicecidr "$cidr" --wait=false >/dev/null
  until_ok 30 sh -c "kubectl get events --field-selector involvedObject.name=$cidr,type=Warning -o jsonpath='{.items[*].message}' | grep -q 'fd00:10:97::10'" \
    || fail "no Warning Event naming the blocking IPv6 address on $cidr"
  sleep 12
  k get servicecidr "$cidr" >/dev/null 2>&1 || fail "$cidr went while fd00:10:97::10 was allocated from it"
  k -n "$ns" delete service v6 >/dev/null
  t0=$EPOCHREALTIME
  until_ok 40 sh -c "! kubectl get servicecidr $cidr" || fail "$cidr still there 40 s after its last IP went"
  say "dual-stack $cidr released $(since "$t0") s after its last (IPv6) address went"
  k delete namespace "$ns" --wait=false >/dev/null
}

# helm upgrade rolls the node-agent across every node while a UDP client on each node talks to
# a serving backend: no such flow is deleted (a deleted entry comes back with another id), and
# every node's agent is Ready again.
test_multinode_daemonset_rollout_keeps_serving_flows() {
  local ns vip n ids_before ids_after t0
  ns=$(new_namespace rollout)
  udp_server "$ns" steady "$B" steady | k apply -f - >/dev/null
  k -n "$ns" apply -f - >/dev/null <<Y
apiVersion: v1
kind: Service
metadata: {name: steady}
spec:
  selector: {app: steady}
  ports: [{name: udp, port: 9000, protocol: UDP}]
Y
  k -n "$ns" wait pod/steady --for=condition=Ready --timeout=60s >/dev/null || fail "the server did not start"
  vip=$(k -n "$ns" get svc steady -o jsonpath='{.spec.clusterIP}')
  for n in $(all_nodes); do udp_client "$ns" "client-$n" "$n" "$vip:9000" 5020 | k apply -f - >/dev/null; done
  for n in $(all_nodes); do answered_by "$ns" "client-$n" steady 30 || fail "the client on $n never reached the server"; done
  flow_ids() {
    local n
    for n in $(all_nodes); do
      echo "$n $(on_node "$n" conntrack -L -p udp --sport 5020 --dport 9000 -o id 2>/dev/null | grep -o 'id=[0-9]*' | sort | tr '\n' ' ')"
    done
  }
  ids_before=$(flow_ids)
  t0=$EPOCHREALTIME
  "$HELM" upgrade "$RELEASE" "$root/charts/groundskeeper" -n "$NS" -f "$here/values.yaml" \
    --set-string nodeAgent.podAnnotations.e2e-rollout="$RANDOM" >/dev/null || fail "helm upgrade"
  k -n "$NS" rollout status daemonset/"$RELEASE"-groundskeeper-node-agent --timeout=180s >/dev/null || fail "the node-agent did not roll out"
  say "node-agent rolled across $(all_nodes | wc -l) nodes in $(since "$t0") s"
  sleep 3
  ids_after=$(flow_ids)
  echo "$ids_before" | sed 's/^/    flows before: /'
  [ "$ids_before" = "$ids_after" ] || fail "a flow to the serving backend was deleted during the rollout: after: $ids_after"
  echo "$ids_before" | awk 'NF < 2 { exit 1 }' || fail "a node had no client flow to watch: $ids_before"
  cluster_whole
  k delete namespace "$ns" --wait=false >/dev/null
}

# Nodes that differ: A and C forbid kernel.msgmax by an Enforce SysctlPolicy (by node label),
# B allows it (kubelet's --allowed-unsafe-sysctls, no policy). Pods asking for it run on B, none
# on A or C, and none is failed or recreated on the way.
test_multinode_sysctl_heterogeneous_nodes() {
  trap restore_nodes EXIT
  local ns i on_b=0 elsewhere=0 p node
  ns=$(new_namespace hetero)
  k label node "$A" "$C" e2e-sysctl=strict --overwrite >/dev/null
  k apply -f - >/dev/null <<Y
apiVersion: groundskeeper.dev/v1alpha1
kind: SysctlPolicy
metadata: {name: e2e-strict}
spec:
  mode: Enforce
  allowedUnsafeSysctls: []
  nodeSelector: {matchLabels: {e2e-sysctl: strict}}
Y
  sleep 2
  for i in $(seq 1 6); do sysctl_pod "$ns" "msg-$i" kernel.msgmax; echo ---; done | k apply -f - >/dev/null
  until_ok 90 sh -c "[ \$(kubectl -n $ns get pods --field-selector=status.phase=Running --no-headers | wc -l) -eq 6 ]" \
    || say "not all 6 pods Running after 90 s: $(k -n "$ns" get pods -o wide --no-headers | awk '{ print $1, $3, $7 }' | tr '\n' ';')"
  for p in $(k -n "$ns" get pods -o jsonpath='{.items[*].metadata.name}'); do
    node=$(pod_node "$p" "$ns")
    if [ "$node" = "$B" ]; then on_b=$((on_b + 1)); elif [ -n "$node" ] && ran "$ns" "$p"; then elsewhere=$((elsewhere + 1)); fi
  done
  say "sysctl placement: $on_b of 6 pods run on $B, the one node that allows kernel.msgmax; $elsewhere on a forbidding node"
  k delete sysctlpolicy e2e-strict >/dev/null
  k label node "$A" "$C" e2e-sysctl- >/dev/null
  [ "$elsewhere" -eq 0 ] || fail "$elsewhere pods ran on a node whose policy forbids kernel.msgmax"
  [ "$on_b" -eq 6 ] || fail "only $on_b of 6 pods run on $B"
  k delete namespace "$ns" --wait=false >/dev/null
}

# One controller-manager replica's node cut off (its pod still looks Ready for a while, and the
# apiserver's calls to it time out): Enforce still holds for new pods.
test_multinode_sysctl_enforce_with_a_replica_cut_off() {
  trap restore_nodes EXIT
  local ns leader victim node i created=0 ran_n=0 p
  ns=$(new_namespace cutwebhook)
  until_ok 30 leader_pod || fail "no leader"
  leader=$(leader_pod)
  victim=$(for p in $(cm_pods); do [ "$p" = "$leader" ] || echo "$p"; done | head -n 1)
  [ -n "$victim" ] || fail "one controller-manager replica only"
  node=$(pod_node "$victim")
  [ "$node" != "$(pod_node "$leader")" ] || fail "both replicas on $node"
  enforce_policy e2e-cut '["kernel.shm_rmid_forced"]'
  sleep 2
  cut_node "$node"
  for i in $(seq 1 10); do
    if sysctl_pod "$ns" "cut-$i" kernel.msgmax | k apply -f - >/dev/null 2>&1; then created=$((created + 1)); fi
    sleep 2
  done
  sleep 10
  for p in $(k -n "$ns" get pods -o jsonpath='{.items[*].metadata.name}'); do ran "$ns" "$p" && ran_n=$((ran_n + 1)); done
  heal_node "$node"
  echo "sysctl enforce, replica on $node cut off: $ran_n of 10 forbidden pods ran ($created created)"
  k delete sysctlpolicy e2e-cut >/dev/null
  k delete namespace "$ns" --wait=false >/dev/null
  cluster_whole
  [ "$ran_n" -eq 0 ] || fail "$ran_n forbidden pods ran with one webhook replica cut off"
}

# Every webhook replica down (the Deployment scaled to 0): a pod that sets a forbidden sysctl
# runs on no node, and every other pod schedules as if groundskeeper were not installed.
test_multinode_sysctl_fail_closed_every_replica_down() {
  trap restore_nodes EXIT
  local ns i n=10 m=10 ran_n=0 scheduled p deploy=$RELEASE-groundskeeper-controller-manager
  ns=$(new_namespace failclosed)
  enforce_policy e2e-failclosed '["kernel.shm_rmid_forced"]'
  sleep 2
  k -n "$NS" scale deployment "$deploy" --replicas=0 >/dev/null
  until_ok 60 sh -c "[ -z \"\$(kubectl -n $NS get pods -l app.kubernetes.io/component=controller-manager -o name)\" ]" \
    || fail "the controller-manager replicas did not go"
  local refused=0
  for i in $(seq 1 "$n"); do sysctl_pod "$ns" "forbidden-$i" kernel.msgmax | k apply -f - >/dev/null 2>&1 || refused=$((refused + 1)); done
  for i in $(seq 1 "$m"); do
    k -n "$ns" run "plain-$i" --image=gk.local/tools:1 --restart=Never --command -- sleep 3600 >/dev/null
  done
  until_ok 60 sh -c "[ \$(kubectl -n $ns get pods -l run --field-selector=status.phase=Running --no-headers | wc -l) -eq $m ]" || true
  sleep 5
  scheduled=$(k -n "$ns" get pods -l run -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c . || true)
  for p in $(k -n "$ns" get pods -o jsonpath='{.items[*].metadata.name}'); do
    case $p in forbidden-*) ran "$ns" "$p" && ran_n=$((ran_n + 1)) ;; esac
  done
  k -n "$NS" scale deployment "$deploy" --replicas=2 >/dev/null
  echo "sysctl fail-closed: $ran_n of $n forbidden pods ran with every webhook replica down ($refused refused at creation); $scheduled of $m other pods scheduled"
  rollout || fail "the controller-manager did not come back"
  k delete sysctlpolicy e2e-failclosed >/dev/null
  k delete namespace "$ns" --wait=false >/dev/null
  [ "$ran_n" -eq 0 ] || fail "$ran_n forbidden pods ran with every webhook replica down"
  [ "$refused" -eq "$n" ] || fail "only $refused of $n pods that set sysctls were refused at creation with every replica down"
  [ "$scheduled" -eq "$m" ] || fail "only $scheduled of $m pods without sysctls were scheduled with every replica down"
}
