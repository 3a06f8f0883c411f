#!/usr/bin/env bash
# The chart against a real kube-apiserver (KUBECONFIG): the conventions' renders accepted by a
# server-side dry-run, Pod Security refusing the node-agent where the namespace does not allow
# it and admitting it in the namespace the chart creates, the CRD adopted, upgraded and kept
# through the template, helm upgrade from the previous chart version and helm uninstall leaving
# nothing that blocks (an admin must be able to undo an install). Run by charts/check.sh
# (cwd: charts/) as: check_cluster.sh HELM KUBECTL OUT_DIR PREV_DIR NS (PREV_DIR may be empty).
# No kubelet or kube-controller-manager runs here: no pod starts, so what a running pod does
# (one leader through the upgrade, the post-delete Job) is e2e's (e2e/tests/zz_operations.sh).
set -euo pipefail
helm=$1 kubectl=$2 out=$3 prev=$4 ns=$5
chart=groundskeeper
# A skip says so; under CI=true it fails, so a CI that lost what a check needs cannot pass by
# skipping it.
skip() { if [ "${CI:-}" = true ]; then echo "FAIL (CI=true, no skips): $*"; exit 1; fi; echo "SKIPPED $*"; }
fail() { echo "FAIL: $*"; exit 1; }
has() { grep "$@" >/dev/null; }
k() { "$kubectl" "$@"; }
# What each helm install made here, removed on exit whatever happened (--no-hooks: the
# post-delete Job has no kubelet to run on).
releases=() namespaces=()
cleanup_cluster() {
  for r in "${releases[@]}"; do "$helm" uninstall "${r%/*}" -n "${r#*/}" --no-hooks >/dev/null 2>&1 || true; done
  for n in "${namespaces[@]}"; do k delete namespace "$n" --wait=false >/dev/null 2>&1 || true; done
}
trap cleanup_cluster EXIT
crd=sysctlpolicies.groundskeeper.dev

## the renders of the table are objects this apiserver accepts: 63-character names
## (Service names are DNS labels), common and pod labels, existing service accounts.
long=$(printf 'x%.0s' $(seq 1 63))
for extra in "--set fullnameOverride=$long" "--set nameOverride=${long:0:60}" \
  "--set commonLabels.team=platform --set-string controllerManager.podLabels.tier=cm --set-string nodeAgent.podLabels.tier=agent" \
  "--set nodeAgent.serviceAccount.create=false --set nodeAgent.serviceAccount.name=default --set controllerManager.serviceAccount.automount=false" \
  "--set crds.install=true" "-f $chart/presets/managed-cluster.yaml" \
  "--set controllerManager.hostNetwork=true --set controllerManager.sysctlWebhook.port=10260 --set controllerManager.startupProbe.enabled=true" \
  "--set nodeAgent.updateStrategy.type=OnDelete --set nodeAgent.startupProbe.enabled=true --set nodeAgent.readinessProbe.successThreshold=2" \
  "--set global.imageRegistry=mirror.example --set global.imagePullSecrets={a,b} --set imagePullSecrets[0].name=c --set image.digest=sha256:$(printf 'ab%.0s' $(seq 1 32))"; do
  # shellcheck disable=SC2086
  "$helm" template "r$(printf 'r%.0s' $(seq 1 52))" "$chart" -n "$ns" $extra \
    | k apply --dry-run=server -n "$ns" -f - >/dev/null 2>"$out/err" || fail "server dry-run refused the render with $extra: $(cat "$out/err")"
done
echo "chart: long names, labels, service accounts, the CRD template and the workload knobs pass a server-side dry-run"

## the monitoring objects, against the Prometheus Operator's own CRDs (testdata/, v0.93.0): every
## scrape and alert knob in forms the operator accepts. Removed on exit, so what runs next on this
## apiserver sees no Prometheus Operator.
k apply --server-side -f testdata/prometheus-operator/ >/dev/null
monitoring_crds=(servicemonitors.monitoring.coreos.com podmonitors.monitoring.coreos.com prometheusrules.monitoring.coreos.com)
trap 'cleanup_cluster; k delete crd "${monitoring_crds[@]}" --ignore-not-found --wait=false >/dev/null 2>&1 || true' EXIT
k wait --for condition=established --timeout=60s "${monitoring_crds[@]/#/crd/}" >/dev/null
mon="--api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PodMonitor --api-versions monitoring.coreos.com/v1/PrometheusRule"
all=$chart/ci/everything-on-values.yaml
for extra in "-f $all" \
  "-f $all --set metrics.serviceMonitor.enabled=false --set metrics.podMonitor.enabled=true --set metrics.podMonitor.scheme=https --set metrics.podMonitor.tlsConfig.insecureSkipVerify=true --set metrics.podMonitor.scrapeTimeout=5s --set metrics.podMonitor.relabelings[0].targetLabel=x --set metrics.podMonitor.metricRelabelings[0].action=drop --set metrics.podMonitor.metricRelabelings[0].regex=go_.*" \
  "-f $all --set metrics.scrapeToken.create=false --set metrics.scrapeToken.secretName=my-token --set metrics.scrapeToken.key=t"; do
  # shellcheck disable=SC2086
  "$helm" template gk "$chart" -n "$ns" $mon $extra > "$out/mon.yaml"
  for kind in ServiceMonitor PrometheusRule; do
    [ "$kind" = ServiceMonitor ] && has "metrics.podMonitor.enabled=true" <<<"$extra" && kind=PodMonitor
    has "^kind: $kind$" "$out/mon.yaml" || fail "$extra: no $kind to dry-run"
  done
  k apply --dry-run=server -n "$ns" -f "$out/mon.yaml" >/dev/null 2>"$out/err" || fail "server dry-run refused the monitoring render with $extra: $(cat "$out/err")"
done
echo "chart: ServiceMonitor, PodMonitor and PrometheusRule with every scrape and alert knob pass a server-side dry-run against the Prometheus Operator's CRDs"

## Pod Security. The node-agent's pod, as its DaemonSet makes it, in a namespace that
## enforces baseline (the DaemonSet itself is admitted: Pod Security judges only pods).
pod_of_daemonset() { # NAMESPACE DAEMONSET: the Pod the DaemonSet controller would create, as JSON
  k -n "$1" get daemonset "$2" -o json | python3 -c '
import json, sys
ds = json.load(sys.stdin)
t = ds["spec"]["template"]
print(json.dumps({"apiVersion": "v1", "kind": "Pod",
  "metadata": {"name": "node-agent-probe", "labels": t["metadata"].get("labels", {})}, "spec": t["spec"]}))'
}
psa=$ns-psa
releases+=("psa/$psa") namespaces+=("$psa")
"$helm" install psa "$chart" -n "$psa" --create-namespace --skip-crds --set namespace.create=true >/dev/null \
  || fail "helm install --create-namespace with namespace.create=true"
[ "$(k get namespace "$psa" -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}')" = privileged ] \
  || fail "namespace.create=true did not label the namespace enforce=privileged"
pod_of_daemonset "$psa" psa-groundskeeper-node-agent > "$out/agent-pod.json"
k -n "$psa" create --dry-run=server -f "$out/agent-pod.json" >/dev/null 2>"$out/err" \
  || fail "the node-agent's pod is refused in the namespace the chart labelled: $(cat "$out/err")"
strict=$ns-baseline
namespaces+=("$strict")
k create namespace "$strict" >/dev/null
k label namespace "$strict" pod-security.kubernetes.io/enforce=baseline >/dev/null
# (the ServiceAccount admission plugin looks for the pod's account before Pod Security judges)
k -n "$strict" create serviceaccount psa-groundskeeper-node-agent >/dev/null
if k -n "$strict" create --dry-run=server -f "$out/agent-pod.json" >/dev/null 2>"$out/err"; then
  fail "a baseline namespace admitted the node-agent's pod: the check above proves nothing"
fi
has "violates PodSecurity" "$out/err" || fail "the baseline namespace refused the node-agent's pod for another reason: $(cat "$out/err")"
# NOTES read the namespace's level and say what to do.
notes=$("$helm" install gkpsa "$chart" -n "$strict" --skip-crds --dry-run=server 2>&1) || fail "helm install --dry-run=server into $strict: $notes"
echo "$notes" | has "WARNING: namespace $strict enforces Pod Security \"baseline\"" || fail "NOTES do not warn about the baseline namespace: $notes"
# The namespace the chart created stays after uninstall (the post-delete Job runs in it).
"$helm" uninstall psa -n "$psa" --no-hooks >/dev/null
k get namespace "$psa" >/dev/null 2>&1 || fail "helm uninstall deleted the namespace namespace.create made"
echo "chart: Pod Security refuses the node-agent in a baseline namespace, admits it in the one namespace.create labels, NOTES warn"

## helm upgrade from the previous chart version, then the CRD through the template.
if [ -z "$prev" ]; then
  skip "upgrade from the previous chart version: its commit is not in this clone (git fetch --unshallow)"
else
  up=$ns-up
  releases+=("up/$up") namespaces+=("$up")
  k create namespace "$up" >/dev/null
  "$helm" install up "$prev" -n "$up" >/dev/null || fail "helm install of the previous chart version"
  sel() { k -n "$up" get deployment/up-groundskeeper-controller-manager daemonset/up-groundskeeper-node-agent -o jsonpath='{range .items[*]}{.spec.selector}{"\n"}{end}'; }
  before=$(sel)
  "$helm" upgrade up "$chart" -n "$up" >/dev/null 2>"$out/err" || fail "helm upgrade from the previous chart version: $(cat "$out/err")"
  [ "$(sel)" = "$before" ] || fail "the workloads' selectors changed in the upgrade"
  echo "chart: helm upgrade from the previous chart version (the chart at $(cat "$out/prev-ref")) passes, selectors unchanged"

  # crds/ alone: a new chart version's CRD never reaches the cluster on upgrade.
  cp -r "$chart" "$out/next"
  sed -i 's/^        description: Allows unsafe sysctls/        description: NEXT-VERSION Allows unsafe sysctls/' "$out/next/crds/$crd.yaml"
  has NEXT-VERSION "$out/next/crds/$crd.yaml" || fail "could not make the next version's CRD"
  "$helm" upgrade up "$out/next" -n "$up" >/dev/null
  desc() { k get crd "$crd" -o jsonpath='{.spec.versions[0].schema.openAPIV3Schema.description}'; }
  desc | has NEXT-VERSION && fail "helm upgrade changed a crds/ CRD: Helm's documented behaviour changed, revisit the CRD template"
  # crds.install on an existing release: Helm refuses to take a CRD it did not create, unless
  # told to (docs/upgrade.md).
  if "$helm" upgrade up "$out/next" -n "$up" --set crds.install=true >/dev/null 2>"$out/err"; then
    fail "helm took over the crds/ CRD without --take-ownership"
  fi
  has "cannot be imported into the current release" "$out/err" || fail "crds.install=true on an existing release failed otherwise: $(cat "$out/err")"
  "$helm" upgrade up "$out/next" -n "$up" --set crds.install=true --take-ownership >/dev/null 2>"$out/err" \
    || fail "helm upgrade --take-ownership --set crds.install=true: $(cat "$out/err")"
  desc | has NEXT-VERSION || fail "crds.install=true: helm upgrade did not upgrade the CRD"
  [ "$(k get crd "$crd" -o jsonpath='{.metadata.annotations.meta\.helm\.sh/release-name}')" = up ] || fail "the CRD is not the release's after adoption"
  [ "$(k get crd "$crd" -o jsonpath='{.metadata.annotations.helm\.sh/resource-policy}')" = keep ] || fail "crds.keep did not mark the CRD keep"
  # A SysctlPolicy survives helm uninstall (crds.keep).
  printf 'apiVersion: groundskeeper.dev/v1alpha1\nkind: SysctlPolicy\nmetadata: {name: chart-check-keep}\nspec: {mode: Audit, nodeSelector: {matchLabels: {chart-check: no-such-node}}}\n' > "$out/policy.yaml"
  if k apply -f "$out/policy.yaml" >/dev/null 2>"$out/err"; then kept_policy=1; else kept_policy=; echo "chart: (no SysctlPolicy created: $(head -1 "$out/err"))"; fi

  ## helm uninstall leaves nothing that blocks: no webhook configuration or admission
  ## policy (a Fail-policy webhook with no backend would block pod bindings), no RBAC, no
  ## namespaced object of the release; only the kept CRD.
  "$helm" uninstall up -n "$up" --no-hooks >/dev/null 2>"$out/err" || fail "helm uninstall: $(cat "$out/err")"
  left=$(k get clusterroles,clusterrolebindings,validatingwebhookconfigurations,validatingadmissionpolicies,validatingadmissionpolicybindings \
    -l app.kubernetes.io/instance=up -o name)
  [ -z "$left" ] || fail "left after helm uninstall: $left"
  left=$(k -n "$up" get all,serviceaccounts,roles,rolebindings,poddisruptionbudgets,configmaps,secrets,networkpolicies \
    -l app.kubernetes.io/instance=up -o name)
  [ -z "$left" ] || fail "left in the namespace after helm uninstall: $left"
  k get crd "$crd" >/dev/null 2>&1 || fail "helm uninstall deleted the CRD despite crds.keep"
  if [ -n "$kept_policy" ]; then
    k get sysctlpolicy chart-check-keep >/dev/null || fail "helm uninstall took the SysctlPolicies with it"
    k delete sysctlpolicy chart-check-keep >/dev/null
  fi
  # Put back the CRD of this tree for whatever runs next on this apiserver.
  k apply --server-side --force-conflicts -f "$chart/crds/" >/dev/null
  echo "chart: crds/ never upgraded; crds.install adopts (--take-ownership), upgrades and keeps the CRD; helm uninstall leaves no RBAC, webhook, policy or namespaced object"
fi
