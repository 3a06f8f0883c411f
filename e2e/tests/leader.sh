# Leader election of the controller-manager's two replicas, the way an admin disturbs it.

# Samples, every 0.5 s for SECONDS, how many replicas say they lead; fails on two at once.
# The replicas are scraped one after another, so a handover between two scrapes counts the old
# leader and the new one: two claims count only when a second sample, taken at once, sees them
# again (a real split brain lasts at least a renew period; a handover does not repeat).
never_two_leaders() { # seconds
  local end=$((SECONDS + $1)) n
  while [ $SECONDS -lt $end ]; do
    n=$(leaders_now)
    if [ "$n" -gt 1 ]; then
      n=$(leaders_now)
      [ "$n" -le 1 ] || { fail "$n replicas lead at once (seen twice in a row)"; return 1; }
    fi
    sleep 0.5
  done
}

test_leader_delete_pod_other_replica_takes_over() {
  local old new t0
  until_ok 30 leader_pod || fail "no leader"
  old=$(leader_pod)
  t0=$EPOCHREALTIME
  k -n "$NS" delete pod "$old" --wait=false >/dev/null
  until_ok 30 sh -c ". $here/lib.sh; p=\$(leader_pod) && [ \"\$p\" != $old ]" || fail "no other replica took over from $old"
  new=$(leader_pod)
  say "$new took over from $old $(since "$t0") s after the delete"
  never_two_leaders 10
  rollout || fail "the Deployment did not come back"
}

test_leader_sigkill_takeover_within_lease() {
  local old cid t0 took id
  until_ok 30 leader_pod || fail "no leader"
  old=$(leader_pod)
  id=$(k -n "$NS" get lease groundskeeper-controller-manager -o jsonpath='{.spec.holderIdentity}')
  cid=$(k -n "$NS" get pod "$old" -o jsonpath='{.status.containerStatuses[0].containerID}' | sed 's|.*://||')
  t0=$EPOCHREALTIME
  ctr_on "$(pod_node "$old")" tasks kill -s SIGKILL "$cid" >/dev/null || fail "could not SIGKILL the leader's container"
  # The other replica, or the killed one restarted by kubelet (a new process: a new identity).
  until_ok 30 sh -c "id=\$(kubectl -n $NS get lease groundskeeper-controller-manager -o jsonpath='{.spec.holderIdentity}'); [ -n \"\$id\" ] && [ \"\$id\" != '$id' ]" \
    || fail "nobody took over within 30 s of the SIGKILL"
  took=$(since "$t0")
  say "$(k -n "$NS" get lease groundskeeper-controller-manager -o jsonpath='{.spec.holderIdentity}') took over $took s after SIGKILL of $id (lease 15 s)"
  # Safety: the last renewal was at most one retry period (2 s) before the kill, and nobody may
  # take over before a whole lease (15 s) has passed since a standby saw it. The upper bound is
  # liveness only (the figure is printed; speed belongs to benchmarks, not to this test).
  awk -v t="$took" 'BEGIN { exit !(t >= 12.5) }' || fail "takeover $took s after SIGKILL: earlier than the lease (15 s) minus one retry period allows"
  awk -v t="$took" 'BEGIN { exit !(t <= 30) }' || fail "takeover took $took s, more than twice the lease"
  never_two_leaders 6
  rollout || fail "the Deployment did not come back"
}

test_leader_no_false_conflict_alarm_after_failover() {
  local p
  for p in $(cm_pods); do
    k -n "$NS" logs "$p" | has 'another ServiceCIDR controller writes' && fail "$p reports a foreign ServiceCIDR controller after failover"
    [ "$(cm_metric "$p" groundskeeper_servicecidr_conflicting_controller_detected)" = 0 ] \
      || fail "$p: groundskeeper_servicecidr_conflicting_controller_detected is not 0"
  done
  return 0
}
