#!/usr/bin/env bash
# Chart checks for `make test`: lint, render (defaults and everything on), the CRDs identical to
# crds/, and against a real apiserver when KUBECONFIG is set: a server-side dry-run apply and a
# real `helm install` whose workload objects must appear.
set -euo pipefail
helm=${1:-helm}
kubectl=${2:-kubectl}
cd "$(dirname "$0")"
chart=groundskeeper
all=$chart/ci/everything-on-values.yaml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$helm" lint --strict "$chart"
"$helm" lint --strict "$chart" -f "$all"
"$helm" template gk "$chart" -n groundskeeper > "$out/default.yaml"
"$helm" template gk "$chart" -n groundskeeper -f "$all" > "$out/all.yaml"
for f in default all; do
  for kind in Deployment DaemonSet ClusterRole ServiceAccount; do
    grep -q "^kind: $kind$" "$out/$f.yaml" || { echo "FAIL: $f render has no $kind"; exit 1; }
  done
done
for kind in ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding; do
  grep -q "^kind: $kind$" "$out/default.yaml" || { echo "FAIL: default render has no $kind (node-agent own-node guard)"; exit 1; }
done
grep -q -- "--sysctl-default-mode=audit$" "$out/default.yaml" || { echo "FAIL: default sysctl mode must be audit"; exit 1; }
grep -q -- "--sysctl-default-mode=enforce$" "$out/all.yaml" || { echo "FAIL: sysctl.defaultMode=Enforce not passed to node-agent"; exit 1; }
grep -q "privileged: true" "$out/default.yaml" && { echo "FAIL: default node-agent must not be privileged"; exit 1; }
grep -q "privileged: true" "$out/all.yaml" || { echo "FAIL: conntrack sysctls set but node-agent not privileged"; exit 1; }
# Bad values are refused by values.schema.json with a message naming them.
if msg=$("$helm" template gk "$chart" --set controllerManager.podGC.gcPeriod=soon 2>&1); then
  echo "FAIL: a bad duration was accepted"; exit 1
fi
echo "$msg" | grep -q "gcPeriod" || { echo "FAIL: schema error does not name gcPeriod: $msg"; exit 1; }

# The chart's CRDs are the generated ones in crds/.
for crd in ../crds/*.yaml; do
  [ -e "$crd" ] || continue
  cmp -s "$crd" "$chart/crds/$(basename "$crd")" || { echo "FAIL: $chart/crds/$(basename "$crd") differs from crds/ (run make crds)"; exit 1; }
done
echo "chart: lint, render, schema and CRD checks passed"

if [ -z "${KUBECONFIG:-}" ]; then
  echo "SKIPPED chart install checks: KUBECONFIG not set"
  exit 0
fi
ns=gk-chart-$$
"$kubectl" create namespace "$ns" >/dev/null
cleanup() { "$helm" uninstall gk -n "$ns" >/dev/null 2>&1 || true; "$kubectl" delete namespace "$ns" --wait=false >/dev/null 2>&1 || true; rm -rf "$out"; }
trap cleanup EXIT
"$kubectl" apply --server-side --dry-run=server -f "$chart/crds/" >/dev/null
"$helm" template gk "$chart" -n "$ns" -f "$all" --set metrics.serviceMonitor.enabled=false \
  | "$kubectl" apply --dry-run=server -n "$ns" -f - >/dev/null
echo "chart: server-side dry-run apply passed"
"$helm" install gk "$chart" -n "$ns" >/dev/null
"$kubectl" -n "$ns" get deployment/gk-groundskeeper-controller-manager daemonset/gk-groundskeeper-node-agent \
  serviceaccount/gk-groundskeeper-controller-manager serviceaccount/gk-groundskeeper-node-agent >/dev/null
"$kubectl" get clusterrole/gk-groundskeeper-controller-manager clusterrole/gk-groundskeeper-node-agent >/dev/null
"$kubectl" get crd/sysctlpolicies.groundskeeper.dev >/dev/null
"$kubectl" -n "$ns" get poddisruptionbudget/gk-groundskeeper-controller-manager role/gk-groundskeeper-controller-manager-leader-election >/dev/null
vap=gk-groundskeeper-node-agent-own-node-pods
"$kubectl" get validatingadmissionpolicy/$vap validatingadmissionpolicybinding/$vap >/dev/null
# kube-controller-manager's validatingadmissionpolicy-status-controller type-checks the policy's
# CEL and writes the verdict to status; wait (bounded) for it. A test control plane has no
# kube-controller-manager: say so rather than pass silently (own_node_cluster.rs proves the
# policy's behaviour there).
typed=
for _ in $(seq 1 25); do
  typed=$("$kubectl" get validatingadmissionpolicy/$vap -o jsonpath='{.status.observedGeneration}')
  [ -n "$typed" ] && break
  sleep 0.2
done
if [ -n "$typed" ]; then
  warnings=$("$kubectl" get validatingadmissionpolicy/$vap -o jsonpath='{.status.typeChecking.expressionWarnings}')
  [ -z "$warnings" ] || { echo "FAIL: own-node policy CEL type-check warnings: $warnings"; exit 1; }
else
  echo "chart: own-node policy has no type-check verdict (kube-controller-manager writes it and none runs here); own_node_cluster.rs runs its CEL on this apiserver"
fi
echo "chart: helm install created the workloads, RBAC, CRD and the own-node admission policy"
