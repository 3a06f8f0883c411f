#!/usr/bin/env bash
# Chart checks for `make test`: lint, render (defaults and everything on), the CRDs identical to
# crds/, the manifest for `kubectl apply -f` (manifest.sh), NOTES.txt and README.md's quick start
# (notes_check.py), and against a real apiserver when KUBECONFIG is set: a server-side dry-run
# apply and a real `helm install` whose workload objects must appear.
set -euo pipefail
helm=${1:-helm}
kubectl=${2:-kubectl}
# Paths given relative to the caller's directory still work after the cd below.
for tool in helm kubectl; do
  case ${!tool} in /*) ;; */*) printf -v "$tool" '%s' "$(pwd)/${!tool}" ;; esac
done
cd "$(dirname "$0")"
chart=groundskeeper
all=$chart/ci/everything-on-values.yaml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# grep -q in a pipeline stops reading at its first match; the writer's SIGPIPE then fails the
# pipeline under pipefail, at random (CI failed on the cert-manager check that way). `has`
# reads everything.
has() { grep "$@" >/dev/null; }
fail() { echo "FAIL: $*"; exit 1; }

# Every value the schema accepts is read by a template (values_used.py): an accepted value is
# never silently ignored. A copy of the chart whose schema accepts one more key must fail.
python3 values_used.py "$chart"
mkdir -p "$out/unread" && cp -r "$chart" "$out/unread/"
python3 - "$out/unread/$chart/values.schema.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["properties"]["controllerManager"]["properties"]["unreadKnob"] = {"type": "string"}
json.dump(s, open(sys.argv[1], "w"))
PY
if python3 values_used.py "$out/unread/$chart" > "$out/unread.out"; then fail "values_used.py passed a schema key no template reads"; fi
has "controllerManager.unreadKnob" "$out/unread.out" || fail "values_used.py did not name the unread key: $(cat "$out/unread.out")"
"$helm" lint --strict "$chart"
"$helm" lint --strict "$chart" -f "$all"
"$helm" template gk "$chart" -n groundskeeper > "$out/default.yaml"
# Everything on, in a cluster that serves the Prometheus Operator's CRDs (ServiceMonitor and
# PrometheusRule are rendered only there).
"$helm" template gk "$chart" -n groundskeeper -f "$all" --api-versions monitoring.coreos.com/v1/ServiceMonitor \
  --api-versions monitoring.coreos.com/v1/PrometheusRule > "$out/all.yaml"
# Chart.yaml's Artifact Hub annotations name the default image and the CRD of crds/.
hub_image=$(sed -n 's/^      image: \(.*\)$/\1/p' "$chart/Chart.yaml")
has -x "          image: $hub_image" "$out/default.yaml" || fail "Chart.yaml's artifacthub.io/images (${hub_image:-none}) is not the default render's image"
for want in "name: $(sed -n 's/^  name: //p' "$chart"/crds/*.yaml | head -1)" "version: $(sed -n 's/^    name: \(v[0-9a-z]*\)$/\1/p' "$chart"/crds/*.yaml | head -1)"; do
  sed -n '/artifacthub.io\/crds: |/,/artifacthub.io\/crdsExamples/p' "$chart/Chart.yaml" | has -- "$want$" \
    || fail "Chart.yaml's artifacthub.io/crds lacks $want (crds/)"
done
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
# The sysctl webhook: on by default, every replica; it judges with the node-agent's values.
for kind in ValidatingWebhookConfiguration Service Role; do
  grep -q "^kind: $kind$" "$out/default.yaml" || { echo "FAIL: default render has no $kind (sysctl webhook)"; exit 1; }
done
grep -q -- "--sysctl-webhook=true$" "$out/default.yaml" || { echo "FAIL: the controller-manager does not serve the sysctl webhook by default"; exit 1; }
[ "$(grep -c -- "--sysctl-default-mode=enforce$" "$out/all.yaml")" = 2 ] \
  || { echo "FAIL: sysctl.defaultMode must reach both the node-agent and the webhook"; exit 1; }
[ "$(grep -c -- "--allowed-unsafe-sysctls=net.core.somaxconn,kernel.msg\*$" "$out/all.yaml")" = 2 ] \
  || { echo "FAIL: allowedUnsafeSysctls must reach both the node-agent and the webhook"; exit 1; }
[ "$(grep -c -- "--default-pod-sysctls=net.core.somaxconn=1024," "$out/all.yaml")" = 1 ] \
  || { echo "FAIL: sysctl.defaultPodSysctls must reach the node-agent (only)"; exit 1; }
vwc=$("$helm" template gk "$chart" -n groundskeeper --show-only templates/sysctl-webhook.yaml)
# The binding webhook sees every binding: it fails open. The two that see only pods setting
# sysctls some node could forbid (the gate, pods created on their node) fail closed.
[ "$(echo "$vwc" | grep -c "failurePolicy: Ignore$")" = 1 ] || { echo "FAIL: the binding webhook must fail open by default"; exit 1; }
[ "$(echo "$vwc" | grep -c "failurePolicy: Fail$")" = 2 ] || { echo "FAIL: the gate and the webhook on pods created on their node must fail closed by default"; exit 1; }
for want in "resources: \[\"pods/binding\", \"bindings\"\]" "- kube-system" "- groundskeeper$" "name: sets-sysctls" "name: bound-at-creation" \
  "name: not-a-mirror-pod" "targetPort: webhook" "sideEffects: None"; do
  echo "$vwc" | has -- "$want" || { echo "FAIL: the webhook configuration lacks: $want"; exit 1; }
done
"$helm" template gk "$chart" --set controllerManager.sysctlWebhook.failurePolicy=Fail --show-only templates/sysctl-webhook.yaml \
  | has "failurePolicy: Fail$" || { echo "FAIL: failurePolicy=Fail not rendered"; exit 1; }
cm=$("$helm" template gk "$chart" -n groundskeeper --set controllerManager.sysctlWebhook.certificates.source=cert-manager)
echo "$cm" | has "^kind: Certificate$" && echo "$cm" | has "cert-manager.io/inject-ca-from: groundskeeper/gk-groundskeeper-webhook" \
  && echo "$cm" | has -- "--webhook-certificates=secret$" || { echo "FAIL: cert-manager mode"; exit 1; }
echo "$cm" | has "validatingwebhookconfigurations\|mutatingwebhookconfigurations\|--webhook-mutating-configuration" && { echo "FAIL: with cert-manager the controller-manager must not patch the webhook configurations"; exit 1; }
[ "$(echo "$cm" | grep -c "cert-manager.io/inject-ca-from: groundskeeper/gk-groundskeeper-webhook$")" = 2 ] \
  || { echo "FAIL: cert-manager's cainjector must fill both webhook configurations"; exit 1; }
"$helm" template gk "$chart" --set controllerManager.sysctlWebhook.enabled=false | has -- "--sysctl-webhook\|ValidatingWebhookConfiguration\|MutatingWebhookConfiguration\|sysctlplacement" \
  && { echo "FAIL: sysctlWebhook.enabled=false still renders the webhook, the gate or the placement"; exit 1; }
# The sysctl scheduling gate: on by default, fails closed, only for pods that set sysctls and
# name no node, outside the exempt namespaces (the admin's list too); the placement runs with it
# and the controller-manager keeps its caBundle.
gate=$("$helm" template gk "$chart" -n groundskeeper --set 'controllerManager.sysctlWebhook.exemptNamespaces={team-a}' \
  --show-only templates/sysctl-webhook.yaml | awk '/^---/{on=0} /^kind: MutatingWebhookConfiguration$/{on=1} on')
for want in "name: gk-groundskeeper-sysctl-gate$" "failurePolicy: Fail$" "path: /mutate/pod$" "name: sets-sysctls$" \
  "name: not-bound-at-creation$" "name: not-a-mirror-pod$" "operations: \[\"CREATE\"\]" "resources: \[\"pods\"\]" \
  "- kube-system$" "- groundskeeper$" "- team-a$" "sideEffects: None$"; do
  echo "$gate" | has -- "$want" || { echo "FAIL: the gate's MutatingWebhookConfiguration lacks: $want"; exit 1; }
done
grep -q -- "--controllers=servicecidr,podgc,sysctlplacement$" "$out/default.yaml" || { echo "FAIL: the placement controller is not on with the gate"; exit 1; }
grep -q -- "--webhook-mutating-configuration=gk-groundskeeper-sysctl-gate$" "$out/default.yaml" \
  || { echo "FAIL: the controller-manager does not keep the gate's caBundle"; exit 1; }
off=$("$helm" template gk "$chart" -n groundskeeper --set controllerManager.sysctlWebhook.gate.enabled=false)
echo "$off" | has "MutatingWebhookConfiguration\|mutatingwebhookconfigurations" \
  && { echo "FAIL: gate.enabled=false still renders the gate or its RBAC"; exit 1; }
# The placement stays with the gate off: it releases the pods the gate already holds.
echo "$off" | has -- "--controllers=servicecidr,podgc,sysctlplacement$" && echo "$off" | has "sysctl-gate-owner" \
  || { echo "FAIL: gate.enabled=false stops the placement: the pods the gate holds would be stranded"; exit 1; }
echo "$off" | has "^kind: ValidatingWebhookConfiguration$" || { echo "FAIL: gate.enabled=false must keep the binding webhook"; exit 1; }
"$helm" template gk "$chart" --set controllerManager.sysctlWebhook.gate.failurePolicy=Ignore --show-only templates/sysctl-webhook.yaml \
  | awk '/^---/{on=0} /^kind: MutatingWebhookConfiguration$/{on=1} on' | has "failurePolicy: Ignore$" \
  || { echo "FAIL: gate.failurePolicy=Ignore not rendered"; exit 1; }
# The placement's pod patch is narrowed by an admission policy to gated pods, gates and affinity.
grep -q "name: gk-groundskeeper-sysctl-placement-pods$" "$out/default.yaml" || { echo "FAIL: no admission policy narrows the placement's pod patch"; exit 1; }
# The node-agent DaemonSet by default: Linux nodes only, and an admin port on the host network
# that no well-known node component listens on.
ds=$(awk '/^---/{ds=0} /^kind: DaemonSet$/{ds=1} ds' "$out/default.yaml")
echo "$ds" | grep -A1 "^      nodeSelector:$" | has "^        kubernetes.io/os: linux$" \
  || { echo "FAIL: the node-agent DaemonSet is not limited to kubernetes.io/os: linux by default"; exit 1; }
port=$(echo "$ds" | sed -n 's/^ *containerPort: *//p')
# kubelet, kube-proxy, control plane, node-exporter, CSI livenessprobe, cilium, calico,
# node-problem-detector, AWS VPC CNI.
for taken in 10248 10250 10255 10249 10256 2379 2380 2381 6443 10257 10258 10259 9100 9808 9809 9810 \
  4240 4244 9234 9879 9890 9891 9892 9893 9962 9963 9964 9965 9091 9099 20256 20257 61678 61679 61680; do
  [ "$port" != "$taken" ] || { echo "FAIL: the node-agent's default host port $port is a well-known node component's"; exit 1; }
done
echo "$ds" | has -- "--admin-addr=0.0.0.0:$port$" || { echo "FAIL: the agent does not listen on its containerPort ${port:-none}"; exit 1; }
echo "$ds" | has "^      priorityClassName: system-node-critical$" || { echo "FAIL: default priorityClassName"; exit 1; }
"$helm" template gk "$chart" --set nodeAgent.priorityClassName= --show-only templates/node-agent.yaml | has priorityClassName \
  && { echo "FAIL: nodeAgent.priorityClassName= must render no priority class"; exit 1; }
# Every pod the chart renders (both workloads, the uninstall Job, the helm test) runs on Linux
# nodes only, with the user's node labels beside it.
for f in default all; do
  [ "$(grep -A1 "^ *nodeSelector:$" "$out/$f.yaml" | grep -c "^ *kubernetes.io/os: linux$")" = 4 ] \
    || { echo "FAIL: $f render: not every pod (4) has nodeSelector kubernetes.io/os: linux"; exit 1; }
done
"$helm" template gk "$chart" --set controllerManager.nodeSelector.role=infra --show-only templates/controller-manager.yaml \
  | grep -A2 "^      nodeSelector:$" | tr -d ' \n' | has "^nodeSelector:kubernetes.io/os:linuxrole:infra$" \
  || { echo "FAIL: controllerManager.nodeSelector is not merged with kubernetes.io/os: linux"; exit 1; }
# The PodDisruptionBudget takes minAvailable (1 when neither is set) or maxUnavailable, never both.
pdb() { "$helm" template gk "$chart" "$@" --show-only templates/controller-manager.yaml 2>&1 || true; }
pdb | has "^  minAvailable: 1$" || fail "the default PodDisruptionBudget is not minAvailable: 1"
pdb --set controllerManager.podDisruptionBudget.maxUnavailable=1 | has "^  maxUnavailable: 1$" || fail "podDisruptionBudget.maxUnavailable not rendered"
pdb --set controllerManager.podDisruptionBudget.maxUnavailable=1 | has "minAvailable" && fail "podDisruptionBudget.maxUnavailable rendered beside minAvailable"
pdb --set controllerManager.podDisruptionBudget.maxUnavailable=1 --set controllerManager.podDisruptionBudget.minAvailable=1 \
  | has "minAvailable=1 and maxUnavailable=1 are both set" || fail "the chart does not refuse both minAvailable and maxUnavailable"
# Services: the cluster's IP families unless asked (dual-stack on request), labels per Service.
has "ipFamil" "$out/default.yaml" && fail "the default render sets a Service's IP families (the cluster's default must apply)"
svcs=$(awk '/^---/{s=0} /^kind: Service$/{s=1} s' "$out/all.yaml")
[ "$(echo "$svcs" | grep -c "^  ipFamilyPolicy: PreferDualStack$")" = 2 ] || fail "metrics.service.ipFamilyPolicy not on both metrics Services"
echo "$svcs" | grep -A2 "^  ipFamilyPolicy: SingleStack$" | has "^    - IPv4$" || fail "the webhook Service's ipFamilyPolicy/ipFamilies not rendered"
for l in metrics metrics webhook; do echo "$svcs" | has "^    team.example/exposed: $l$" || fail "Service labels ($l) not rendered"; done
# extraObjects: maps and YAML strings alike, through tpl.
has "^# Source: $chart/templates/extra-objects.yaml$" "$out/default.yaml" && fail "extraObjects renders something by default"
awk '/^---/{p=0} /^kind: ConfigMap$/{p=1} p' "$out/all.yaml" | grep -A1 "^  name: 'gk-keeper-extra'$" | has "^  namespace: 'groundskeeper'$" \
  || fail "an extraObjects map was not rendered through tpl"
awk '/^---/{p=0} /^kind: ResourceQuota$/{p=1} p' "$out/all.yaml" | has "^    app.kubernetes.io/instance: gk$" \
  || fail "an extraObjects string was not rendered through tpl"
# Monitors: honorLabels and annotations; in another namespace, selecting the release's, with the
# scraper's account and token Secret beside them (the operator reads Secrets from the monitor's).
[ "$(awk '/^---/{p=0} /^kind: ServiceMonitor$/{p=1} p' "$out/all.yaml" | grep -c "^      honorLabels: true$")" = 2 ] \
  || fail "metrics.serviceMonitor.honorLabels not on both endpoints"
has "honorLabels" "$out/default.yaml" && fail "honorLabels rendered by default"
for kind in ServiceMonitor PodMonitor; do
  key=$(echo "${kind:0:1}" | tr A-Z a-z)${kind:1}
  mon=$("$helm" template gk "$chart" -n groundskeeper --api-versions "monitoring.coreos.com/v1/$kind" --set "metrics.$key.enabled=true" \
    --set "metrics.$key.namespace=monitoring" --set-string "metrics.$key.annotations.a=b" --show-only templates/metrics.yaml)
  mons=$(echo "$mon" | awk -v k="$kind" '/^---/{p=0} $0 == "kind: " k {p=1} p')
  [ "$(echo "$mons" | grep -c "^  namespace: monitoring$")" = 2 ] || fail "metrics.$key.namespace not on both ${kind}s"
  [ "$(echo "$mons" | grep -A1 "^  annotations:$" | grep -c "^    a: b$")" = 2 ] || fail "metrics.$key.annotations not on both ${kind}s"
  [ "$(echo "$mon" | grep -A1 "^  namespaceSelector:$" | grep -c "^    matchNames: \[groundskeeper\]$")" = 2 ] \
    || fail "the ${kind}s in another namespace do not select the release's"
  for scraper in ServiceAccount Secret; do
    echo "$mon" | awk -v k="$scraper" '/^---/{p=0} $0 == "kind: " k {p=1} p' | has "^  namespace: monitoring$" \
      || fail "the scraper's $scraper is not beside the ${kind}s"
  done
done
# Alerts and dashboard keep clusters apart: every aggregation groups by cluster (a label a
# single-cluster Prometheus does not have, where it groups nothing).
rule=$("$helm" template gk "$chart" --api-versions monitoring.coreos.com/v1/PrometheusRule --set metrics.prometheusRule.enabled=true \
  --set controllerManager.leaderElection.enabled=false --set controllerManager.replicas=1 --show-only templates/prometheusrule.yaml; \
  "$helm" template gk "$chart" --api-versions monitoring.coreos.com/v1/PrometheusRule --set metrics.prometheusRule.enabled=true \
  --set nodeAgent.sysctl.defaultMode=Enforce --show-only templates/prometheusrule.yaml)
rule=$(echo "$rule" | grep "^ *expr: ")
nocluster=$(echo "$rule" | grep -E '\b(sum|max|min|avg|count)( by \((\w+, )*\w+\))? ?\(' | grep -vE '\b(sum|max|min) by \(cluster, ' | grep -v "absent(" || true)
[ -z "$nocluster" ] || fail "alert expressions aggregate without cluster: $nocluster"
nocluster=$(sed -n 's/^ *"expr": "\(.*\)",\{0,1\}$/\1/p' "$chart/files/dashboard.json" | grep -E '\b(sum|max|min)\b' | grep -vE '\b(sum|max|min) by \(cluster[,)]' || true)
[ -z "$nocluster" ] || fail "dashboard queries aggregate without cluster: $nocluster"
# The controller-manager admits every pod that sets sysctls (the gate): critical by default too.
"$helm" template gk "$chart" --show-only templates/controller-manager.yaml | has "^      priorityClassName: system-cluster-critical$" \
  || { echo "FAIL: the controller-manager's default priorityClassName is not system-cluster-critical"; exit 1; }
"$helm" template gk "$chart" --set controllerManager.priorityClassName= --show-only templates/controller-manager.yaml | has priorityClassName \
  && { echo "FAIL: controllerManager.priorityClassName= must render no priority class"; exit 1; }
# The node-agent's long-running container is never privileged: when a conntrack sysctl is set,
# a privileged init container writes it and exits.
grep -q "privileged: true" "$out/default.yaml" && { echo "FAIL: default node-agent must not be privileged"; exit 1; }
where=$(awk '/^---/{ds=0} /^kind: DaemonSet$/{ds=1} ds && /^      initContainers:/{s="init"} ds && /^      containers:/{s="agent"}
  /privileged: true/{print (ds ? s : "elsewhere")}' "$out/all.yaml" | tr '\n' ' ')
[ "$where" = "init " ] || { echo "FAIL: with conntrack sysctls set, only the init container may be privileged (privileged in: ${where:-nothing})"; exit 1; }
# ... as uid 0: the image's user (65532) would not keep the capabilities the writes need.
awk '/^---/{ds=0} /^kind: DaemonSet$/{ds=1} ds && /^      initContainers:/{s=1} ds && /^      containers:/{s=0}
  ds && s && /runAsUser: 0$/{found=1} END{exit !found}' "$out/all.yaml" \
  || { echo "FAIL: the conntrack-sysctls init container does not run as uid 0"; exit 1; }
grep -q "^kind: PrometheusRule$" "$out/all.yaml" || { echo "FAIL: everything-on render has no PrometheusRule"; exit 1; }
# No leader also when the leader metric is absent (every replica gone or unscraped): `sum() == 0`
# alone is empty then, and never fires.
noleader=$(grep -A1 "alert: GroundskeeperNoLeader$" "$out/all.yaml" | sed -n 's/^ *expr: //p')
echo "$noleader" | has "== 0) or absent(groundskeeper_leader_election_is_leader{namespace=\"groundskeeper\"})$" \
  || { echo "FAIL: GroundskeeperNoLeader does not fire when the leader metric is absent: ${noleader:-no such alert}"; exit 1; }
grep -q 'grafana_dashboard: "1"' "$out/all.yaml" || { echo "FAIL: everything-on render has no dashboard ConfigMap"; exit 1; }
# The dashboard parses as JSON (the template also refuses to render a broken file).
"$helm" template gk "$chart" --set metrics.dashboard.enabled=true --show-only templates/dashboard.yaml \
  | sed -n '/groundskeeper.json: |-/,$p' | tail -n +2 > "$out/dashboard.json"
if command -v python3 >/dev/null; then
  python3 -m json.tool "$out/dashboard.json" >/dev/null || { echo "FAIL: dashboard is not JSON"; exit 1; }
fi
# Every metric the alerts and the dashboard name is one the code registers (a string literal
# in a crate's src/); histogram series are checked by their base name.
metrics=$(grep -ohE '\b(groundskeeper|pod_gc|kubeproxy)_[a-z0-9_]+' "$out/all.yaml" "$out/dashboard.json" \
  | grep -vE '^groundskeeper_(conntrack|servicecidr|podgc|sysctl|leader|watch)$' \
  | sed -E 's/_(bucket|sum|count)$//' | sort -u)
[ -n "$metrics" ] || { echo "FAIL: no metric names found in the alerts/dashboard"; exit 1; }
for m in $metrics; do
  grep -rqF "\"$m\"" ../controllers/src ../node-agent/src ../plumbing/src && continue
  echo "FAIL: alerts/dashboard use $m, which no crate registers"; exit 1
done
# The previous chart version, to upgrade from and to compare default names with: the chart as
# of the last commit before its names, labels and CRD template changed (PREV_CHART_REF overrides).
prev_ref=${PREV_CHART_REF:-4c8b12f367f96c64fecc0c5611b5cc516cab8a45}
prev=
# A skip says so; under CI=true it fails, so a CI that lost what a check needs cannot pass by
# skipping it.
skip() { if [ "${CI:-}" = true ]; then echo "FAIL (CI=true, no skips): $*"; exit 1; fi; echo "SKIPPED $*"; }
if git -C .. cat-file -e "$prev_ref^{commit}" 2>/dev/null; then
  mkdir -p "$out/prev"
  git -C .. archive "$prev_ref" charts/groundskeeper | tar -x -C "$out/prev"
  prev=$out/prev/charts/groundskeeper
  echo "$prev_ref" > "$out/prev-ref"
else
  skip "comparisons with the previous chart version: commit $prev_ref is not in this clone (git fetch --unshallow)"
fi
bash check_table.sh "$helm" "$out" "$prev"
# Bad values are refused by values.schema.json with a message naming them.
if msg=$("$helm" template gk "$chart" --set controllerManager.podGC.gcPeriod=soon 2>&1); then
  echo "FAIL: a bad duration was accepted"; exit 1
fi
echo "$msg" | has "gcPeriod" || { echo "FAIL: schema error does not name gcPeriod: $msg"; exit 1; }
# Each: a bad setting, and what the refusal must name.
for case in "image.digest=latest:digest|digest" "controllerManager.strategy.type=Sometimes|strategy" \
  "metrics.prometheusRule.conntrackFillThreshold=2|conntrackFillThreshold" \
  "controllerManager.extraVolumeMounts[0].name=x|mountPath" "networkPolicy.metricsFrom=open|metricsFrom" \
  "tests.image.tag=|tag" "nodeAgent.extraEnv[0].value=x|name" \
  "controllerManager.sysctlWebhook.failurePolicy=Sometimes|failurePolicy" \
  "controllerManager.sysctlWebhook.certificates.source=vault|source" \
  "controllerManager.sysctlWebhook.gate.failurePolicy=Sometimes|failurePolicy" \
  "controllerManager.sysctlWebhook.gate.mode=x|mode" \
  "nodeAgent.sysctl.defaultPodSysctls[0]=net.core.somaxconn|defaultPodSysctls"; do
  bad=${case%|*} want=${case##*|}
  if msg=$("$helm" template gk "$chart" --set "$bad" 2>&1); then echo "FAIL: $bad was accepted"; exit 1; fi
  echo "$msg" | has "$want" || { echo "FAIL: schema error for $bad does not name $want: $msg"; exit 1; }
done

# The chart's CRDs are the generated ones in crds/.
for crd in ../crds/*.yaml; do
  [ -e "$crd" ] || continue
  cmp -s "$crd" "$chart/crds/$(basename "$crd")" || { echo "FAIL: $chart/crds/$(basename "$crd") differs from crds/ (run make crds)"; exit 1; }
done
# The release's manifest for `kubectl apply -f` (make manifest) renders, parses, and holds the
# CRD and both workloads and no helm hook; one with the hooks in must fail, so a check that
# checks nothing does not pass.
bash manifest.sh render "$helm" "$out/manifest/groundskeeper.yaml" >/dev/null
bash manifest.sh check "$kubectl" "$out/manifest/groundskeeper.yaml"
"$helm" template groundskeeper "$chart" -n groundskeeper --include-crds --set namespace.create=true > "$out/manifest/hooks.yaml"
if bash manifest.sh check "$kubectl" "$out/manifest/hooks.yaml" >/dev/null; then fail "manifest.sh check passed a manifest with helm hooks"; fi
# What helm install prints (NOTES.txt) and README.md's quick start say what the chart installs
# (notes_check.py). A NOTES that reads a Deployment's log and hides the node-agent's dry-run must
# fail on both, so a check that checks nothing does not pass.
python3 -B notes_check.py "$helm"
mkdir -p "$out/notes" && cp -r "$chart" "$out/notes/"
sed -i '/DRY RUN (node-agent)/d' "$out/notes/$chart/templates/NOTES.txt"
printf '  kubectl -n {{ .Release.Namespace }} logs deploy/{{ .Release.Name }}\n' >> "$out/notes/$chart/templates/NOTES.txt"
if python3 -B notes_check.py "$helm" "$out/notes/$chart" > "$out/notes.out"; then fail "notes_check.py passed a NOTES.txt that reads a Deployment's log"; fi
for want in "kubectl logs TYPE/NAME" "node-agent is in dry-run, NOTES do not say so"; do
  has -F "$want" "$out/notes.out" || fail "notes_check.py did not find: $want ($(head -3 "$out/notes.out"))"
done
echo "chart: lint, render, schema and CRD checks passed"

if [ -z "${KUBECONFIG:-}" ]; then
  skip "chart install checks: KUBECONFIG not set"
  exit 0
fi
ns=gk-chart-$$
"$kubectl" create namespace "$ns" >/dev/null
# The helm test Pod needs the namespace's default ServiceAccount, which kube-controller-manager
# creates; a bare control plane has none.
"$kubectl" -n "$ns" get serviceaccount default >/dev/null 2>&1 || "$kubectl" -n "$ns" create serviceaccount default >/dev/null
cleanup() {
  # --no-hooks: no kubelet runs here to run the post-delete Job (e2e runs it on a real node).
  "$helm" uninstall gk -n "$ns" --no-hooks >/dev/null 2>&1 || true; "$kubectl" delete namespace "$ns" --wait=false >/dev/null 2>&1 || true; rm -rf "$out"; }
trap cleanup EXIT
"$kubectl" apply --server-side --dry-run=server -f "$chart/crds/" >/dev/null
# Artifact Hub's CRD example is one the CRD accepts (the CRD itself is applied for real further on
# by helm install; here a dry run on its own would not know the kind yet).
sed -n '/artifacthub.io\/crdsExamples: |/,$p' "$chart/Chart.yaml" | tail -n +2 | sed 's/^    - //; s/^      //' > "$out/crd-example.yaml"
# No Prometheus Operator CRDs there: ServiceMonitor and PrometheusRule are left out.
"$helm" template gk "$chart" -n "$ns" -f "$all" --set metrics.serviceMonitor.enabled=false \
  --set metrics.prometheusRule.enabled=false \
  | "$kubectl" apply --server-side --dry-run=server -n "$ns" -f - >/dev/null
echo "chart: server-side dry-run apply passed"
"$helm" install gk "$chart" -n "$ns" >/dev/null
"$kubectl" -n "$ns" get deployment/gk-groundskeeper-controller-manager daemonset/gk-groundskeeper-node-agent \
  serviceaccount/gk-groundskeeper-controller-manager serviceaccount/gk-groundskeeper-node-agent >/dev/null
"$kubectl" get clusterrole/gk-groundskeeper-controller-manager clusterrole/gk-groundskeeper-node-agent \
  clusterrole/gk-groundskeeper-sysctlpolicies-view >/dev/null
"$kubectl" get crd/sysctlpolicies.groundskeeper.dev >/dev/null
"$kubectl" apply --dry-run=server -f "$out/crd-example.yaml" >/dev/null 2>"$out/err" \
  || fail "Chart.yaml's artifacthub.io/crdsExamples is refused by the CRD: $(cat "$out/err")"
"$kubectl" -n "$ns" get poddisruptionbudget/gk-groundskeeper-controller-manager role/gk-groundskeeper-controller-manager-leader-election >/dev/null
"$kubectl" get validatingwebhookconfiguration/gk-groundskeeper-sysctl >/dev/null
"$kubectl" -n "$ns" get service/gk-groundskeeper-webhook role/gk-groundskeeper-controller-manager-webhook-tls >/dev/null
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
echo "chart: helm install created the workloads, RBAC, CRD, the sysctl webhook and the own-node admission policy"
# RBAC by name, acting as the controller-manager's ServiceAccount: get and update reach only its
# own Lease and Secret; create, which RBAC can not name, is held to them by the own-objects
# policy (its type too: never a ServiceAccount token Secret).
as_cm() { "$kubectl" --as="system:serviceaccount:$ns:gk-groundskeeper-controller-manager" -n "$ns" "$@"; }
lease() { printf 'apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: %s}\nspec: {}\n' "$1"; }
secret() { printf 'apiVersion: v1\nkind: Secret\nmetadata: {name: %s, annotations: {kubernetes.io/service-account.name: default}}\ntype: %s\n' "$1" "$2"; }
lease kube-scheduler | "$kubectl" -n "$ns" create -f - >/dev/null
secret someone-elses Opaque | "$kubectl" -n "$ns" create -f - >/dev/null
for verb in "get lease kube-scheduler" "get secret someone-elses" "annotate lease kube-scheduler x=y" "annotate secret someone-elses x=y" \
  "delete lease kube-scheduler"; do
  # shellcheck disable=SC2086
  as_cm $verb >/dev/null 2>"$out/err" && fail "the controller-manager may $verb"
  has -i forbidden "$out/err" || fail "$verb failed otherwise: $(cat "$out/err")"
done
# Creates what the generator (and its arguments) prints, as the controller-manager, dry run.
try_create() { "$@" | as_cm create --dry-run=server -f - >/dev/null 2>"$out/err"; }
refused() { ! try_create "$@" && has "may create only its own" "$out/err"; }
# The policy takes effect once the apiserver has loaded it: wait (bounded) for the first refusal.
for _ in $(seq 1 50); do refused lease kube-controller-manager && break; sleep 0.2; done
for obj in "lease kube-controller-manager" "secret gk-groundskeeper-webhook-tls kubernetes.io/service-account-token" "secret other Opaque"; do
  # shellcheck disable=SC2086
  refused $obj || fail "the controller-manager may create $obj: $(cat "$out/err")"
done
try_create lease groundskeeper-controller-manager || fail "the controller-manager may not create its own Lease: $(cat "$out/err")"
try_create secret gk-groundskeeper-webhook-tls Opaque || fail "the controller-manager may not create its own TLS Secret: $(cat "$out/err")"
"$kubectl" -n "$ns" delete lease kube-scheduler >/dev/null
"$kubectl" -n "$ns" delete secret someone-elses >/dev/null
echo "chart: the controller-manager reads and writes only its own Lease and Secret, and creates no other (own-objects policy)"
# Without the Prometheus Operator's CRDs, asking for its objects installs the rest and says so
# (it failed on "no matches for kind ServiceMonitor" before).
notes=$("$helm" upgrade gk "$chart" -n "$ns" --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true 2>&1) \
  || { echo "FAIL: helm upgrade with ServiceMonitor/PrometheusRule on and no Prometheus Operator CRDs: $notes"; exit 1; }
for kind in ServiceMonitor PrometheusRule; do
  echo "$notes" | has "monitoring.coreos.com/v1 $kind" || { echo "FAIL: NOTES do not say the $kind was left out: $notes"; exit 1; }
done
echo "chart: ServiceMonitor and PrometheusRule left out where their CRDs are not served, NOTES say so"
bash check_cluster.sh "$helm" "$kubectl" "$out" "$prev" "$ns"
