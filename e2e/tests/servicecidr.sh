# ServiceCIDR controller, through `kubectl get servicecidrs` as an admin sees it.

test_servicecidr_default_has_finalizer_and_ready() {
  until_ok 30 sh -c "kubectl get servicecidr kubernetes -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True" \
    || fail "the default ServiceCIDR never became Ready=True"
  k get servicecidr kubernetes -o jsonpath='{.metadata.finalizers}' | has networking.k8s.io/service-cidr-finalizer \
    || fail "the default ServiceCIDR has no finalizer"
  k get servicecidrs | sed 's/^/    /'
}

test_servicecidr_deletion_blocked_then_released() {
  local cidr=e2e-extra-$RANDOM ns svc=blocker
  k apply -f - >/dev/null <<Y
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: $cidr}
spec: {cidrs: ["10.97.0.0/24"]}
Y
  until_ok 30 sh -c "kubectl get servicecidr $cidr -o jsonpath='{.metadata.finalizers}{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q 'finalizer.*True'" \
    || fail "$cidr: no finalizer or not Ready"
  ns=$(new_namespace cidr)
  k -n "$ns" create service clusterip "$svc" --tcp=80 --clusterip=10.97.0.10 >/dev/null
  k delete servicecidr "$cidr" --wait=false >/dev/null
  # The IP 10.97.0.10 would be orphaned: the finalizer stays, with a Warning Event saying why.
  until_ok 30 sh -c "kubectl get events --field-selector involvedObject.name=$cidr,type=Warning -o jsonpath='{.items[*].message}' | grep -q 10.97.0.10" \
    || fail "no Warning Event naming the blocking IP on $cidr"
  sleep 12
  k get servicecidr "$cidr" >/dev/null 2>&1 || fail "$cidr went while 10.97.0.10 was allocated from it"
  # What an admin asks: the plugin names the IP, from the API alone.
  plugin why servicecidr "$cidr" > "$CLUSTER_STATE/why-$cidr.txt" || fail "kubectl groundskeeper why servicecidr $cidr failed"
  has 10.97.0.10 "$CLUSTER_STATE/why-$cidr.txt" || fail "the plugin does not name 10.97.0.10: $(cat "$CLUSTER_STATE/why-$cidr.txt")"
  sed 's/^/    plugin: /' "$CLUSTER_STATE/why-$cidr.txt"
  k get events --field-selector involvedObject.name="$cidr" -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message --no-headers | sed 's/^/    event: /'
  local t0
  k -n "$ns" delete service "$svc" >/dev/null
  t0=$EPOCHREALTIME
  until_ok 40 sh -c "! kubectl get servicecidr $cidr" || fail "$cidr still there 40 s after its last IP went"
  # The 10 s grace counts from the deletion, long past: the finalizer goes at once.
  say "finalizer removed $(since "$t0") s after the last IP went"
  k delete namespace "$ns" --wait=false >/dev/null
}

# Upstream's deletionGracePeriod: the finalizer goes no earlier than 10 s after the
# deletionTimestamp (the apiserver's allocators may still be handing out IPs from it).
test_servicecidr_finalizer_waits_the_10s_grace() {
  local cidr=e2e-grace-$RANDOM t0 took
  k apply -f - >/dev/null <<Y
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: $cidr}
spec: {cidrs: ["10.99.0.0/24"]}
Y
  until_ok 30 sh -c "kubectl get servicecidr $cidr -o jsonpath='{.metadata.finalizers}' | grep -q finalizer" || fail "$cidr got no finalizer"
  t0=$EPOCHREALTIME
  k delete servicecidr "$cidr" --wait=false >/dev/null
  until_ok 30 sh -c "! kubectl get servicecidr $cidr" || fail "$cidr still there 30 s after its deletion"
  took=$(since "$t0")
  say "$cidr gone $took s after its deletion"
  # deletionTimestamp is in whole seconds, rounded down: 9 s is the earliest a correct grace allows.
  # The lower bound is the rule; the upper one only catches a finalizer that is never released.
  awk -v t="$took" 'BEGIN { exit !(t >= 9) }' || fail "the finalizer went $took s after the deletion, before the 10 s grace"
  awk -v t="$took" 'BEGIN { exit !(t <= 25) }' || fail "the finalizer went $took s after the deletion (grace: 10 s)"
}
