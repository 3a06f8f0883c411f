#!/usr/bin/env bash
# The chart's conventions and refusals, by rendering with the real
# helm: names and labels (helm create's conventions, the defaults unchanged from the previous
# chart version), the unsafe combinations refused with their message, the Prometheus Operator
# objects only where their CRDs are served, the namespace and its Pod Security labels, the CRD
# as a template. Run by charts/check.sh (cwd: charts/) as: check_table.sh HELM OUT_DIR PREV_DIR
# (PREV_DIR: the previous chart version, rendered from git; empty when the clone lacks it).
set -euo pipefail
helm=$1 out=$2 prev=${3:-}
chart=groundskeeper
fail() { echo "FAIL: $*"; exit 1; }
# grep -q in a pipeline stops reading at its first match, and the writer's SIGPIPE then fails
# the pipeline under pipefail: read everything instead.
has() { grep "$@" >/dev/null; }
render() { "$helm" template gk "$chart" -n groundskeeper "$@"; }
# "Kind name" of every rendered object, one a line.
names() {
  awk '/^---/{if(k)print k, n; k="";n="";m=0} /^kind: /{k=$2} /^metadata:/{m=1;next}
    m&&/^  name: /{n=$2;m=0} /^[a-z]/{m=0} END{if(k)print k, n}'
}
# The documents of one kind.
docs_of() { awk -v want="$1" '/^---/{on=0} $0=="kind: "want{on=1} on'; }

## names and labels.
render > "$out/t-default.yaml"
# The e2e suite and users' scripts rely on these names; they must never change.
for obj in "Deployment gk-groundskeeper-controller-manager" "DaemonSet gk-groundskeeper-node-agent" \
  "ServiceAccount gk-groundskeeper-controller-manager" "ServiceAccount gk-groundskeeper-node-agent" \
  "Service gk-groundskeeper-controller-manager-metrics" "Service gk-groundskeeper-node-agent-metrics" \
  "Service gk-groundskeeper-webhook" "ClusterRole gk-groundskeeper-metrics-reader" \
  "ValidatingWebhookConfiguration gk-groundskeeper-sysctl" "MutatingWebhookConfiguration gk-groundskeeper-sysctl-gate"; do
  names < "$out/t-default.yaml" | has -x "$obj" || fail "default render lacks $obj"
done
if [ -n "$prev" ]; then
  # Every object the previous chart version rendered by default has the same kind and name now,
  # and the workloads' selectors (immutable: helm upgrade fails on a change) are the same.
  "$helm" template gk "$prev" -n groundskeeper > "$out/t-prev.yaml"
  missing=$(comm -23 <(names < "$out/t-prev.yaml" | sort -u) <(names < "$out/t-default.yaml" | sort -u))
  [ -z "$missing" ] || fail "default names changed since the previous chart version; gone: $missing"
  for kind in Deployment DaemonSet; do
    a=$(docs_of $kind < "$out/t-prev.yaml" | sed -n '/^  selector:/,/^  [a-z]/p')
    b=$(docs_of $kind < "$out/t-default.yaml" | sed -n '/^  selector:/,/^  [a-z]/p')
    [ "$a" = "$b" ] || fail "the $kind selector changed since the previous chart version: $a -> $b"
  done
  # ... and every label the previous version put on an object is still there, same value.
  lost=$(comm -23 <(grep -E '^ +(app\.kubernetes\.io|helm\.sh)/[a-z-]+: ' "$out/t-prev.yaml" | sort -u) \
    <(grep -E '^ +(app\.kubernetes\.io|helm\.sh)/[a-z-]+: ' "$out/t-default.yaml" | sort -u))
  [ -z "$lost" ] || fail "default labels changed since the previous chart version: $lost"
fi
# Names are at most 63 characters and distinct per kind, whatever the release name and overrides
# (a property over generated lengths, 1 to 53 for release names as helm allows, up to 63 for
# fullnameOverride; each case also renders with nameOverride).
long=$(printf 'x%.0s' $(seq 1 63))
for n in 1 7 20 33 40 47 53; do
  release=$(printf 'r%.0s' $(seq 1 "$n"))
  for extra in "" "--set nameOverride=${long:0:$((n + 5))}" "--set fullnameOverride=${long:0:$((n + 10 > 63 ? 63 : n + 10))}"; do
    # shellcheck disable=SC2086
    "$helm" template "$release" "$chart" $extra > "$out/t-long.yaml"
    too_long=$(names < "$out/t-long.yaml" | awk 'length($2) > 63')
    [ -z "$too_long" ] || fail "release $release $extra: names over 63 characters: $too_long"
    dup=$(names < "$out/t-long.yaml" | sort | uniq -d)
    [ -z "$dup" ] || fail "release $release $extra: two objects share a name: $dup"
    too_long=$(grep -E '^ +app\.kubernetes\.io/[a-z]+: ' "$out/t-long.yaml" | awk 'length($2) > 63' | sort -u)
    [ -z "$too_long" ] || fail "release $release $extra: label values over 63 characters: $too_long"
  done
done
render --set nameOverride=keeper --set fullnameOverride=custom > "$out/t-over.yaml"
names < "$out/t-over.yaml" | has -x "Deployment custom-controller-manager" || fail "fullnameOverride does not name the Deployment"
docs_of Deployment < "$out/t-over.yaml" | sed -n '/^  selector:/,/^  template:/p' | has "app.kubernetes.io/name: keeper$" \
  || fail "nameOverride is not the app.kubernetes.io/name selector label"
render --set nameOverride=keeper | names | has -x "Deployment gk-keeper-controller-manager" || fail "nameOverride does not name objects"
# commonLabels on every object and every pod; podLabels on that workload's pods, never in a selector.
render -f "$chart/ci/everything-on-values.yaml" --set commonLabels.team=platform \
  --set-string controllerManager.podLabels.tier=cm --set-string nodeAgent.podLabels.tier=agent \
  --api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PrometheusRule \
  --set crds.install=true --set namespace.create=true > "$out/t-labels.yaml"
objects=$(names < "$out/t-labels.yaml" | wc -l)
labelled=$(awk '/^---/{if(k)c+=f; k=0;f=0;m=0} /^kind: /{k=1} /^metadata:/{m=1;next} m&&/^    team: platform$/{f=1} /^[a-z]/{m=0} END{c+=f; print c}' "$out/t-labels.yaml")
[ "$objects" = "$labelled" ] || fail "commonLabels on $labelled of $objects objects"
for w in "Deployment cm" "DaemonSet agent"; do
  d=$(docs_of "${w% *}" < "$out/t-labels.yaml")
  echo "$d" | sed -n '/^  template:/,$p' | has "^        team: platform$" || fail "${w% *} pods lack commonLabels"
  echo "$d" | sed -n '/^  template:/,$p' | has "^        tier: ${w#* }$" || fail "${w% *} pods lack their podLabels"
  echo "$d" | sed -n '/^  selector:/,/^  template:/p' | has "tier:\|team:" && fail "${w% *} selector includes pod or common labels"
done
# serviceAccount: an existing account, named everywhere the chart refers to it.
render --set nodeAgent.serviceAccount.create=false --set nodeAgent.serviceAccount.name=agents \
  --set controllerManager.serviceAccount.name=cm-sa --set-string controllerManager.serviceAccount.annotations.role=x \
  --set controllerManager.serviceAccount.automount=false > "$out/t-sa.yaml"
names < "$out/t-sa.yaml" | has -x "ServiceAccount gk-groundskeeper-node-agent" && fail "serviceAccount.create=false still creates the node-agent's"
names < "$out/t-sa.yaml" | has -x "ServiceAccount cm-sa" || fail "serviceAccount.name does not name the created account"
docs_of ServiceAccount < "$out/t-sa.yaml" | has "^automountServiceAccountToken: false$" || fail "serviceAccount.automount=false not on the account"
docs_of ServiceAccount < "$out/t-sa.yaml" | has "^    role: x$" || fail "serviceAccount.annotations not on the account"
docs_of DaemonSet < "$out/t-sa.yaml" | has "serviceAccountName: agents$" || fail "the DaemonSet does not run as serviceAccount.name"
docs_of Deployment < "$out/t-sa.yaml" | has "serviceAccountName: cm-sa$" || fail "the Deployment does not run as serviceAccount.name"
[ "$(grep -c "^    name: agents$" "$out/t-sa.yaml")" = 1 ] || fail "the node-agent's ClusterRoleBinding does not bind serviceAccount.name"
grep -q "system:serviceaccount:groundskeeper:agents'" "$out/t-sa.yaml" || fail "the own-node policy does not name serviceAccount.name"
render --set nodeAgent.serviceAccount.create=false | docs_of DaemonSet | has "serviceAccountName: default$" \
  || fail "serviceAccount.create=false without a name must use default (as helm create)"
# The schema accepts exactly these: an unknown key beside them is refused, naming it.
for bad in "controllerManager.serviceAccount.automountToken=true|automountToken" "nodeAgent.serviceAccount.labels.a=b|labels" \
  "nameOverride=Bad_Name|nameOverride" "fullnameOverride=$long-x|fullnameOverride" "commonLabel.a=b|commonLabel" \
  "crds.upgrade=true|upgrade" "namespace.name=x|name" "podSecurity.level=baseline|level"; do
  if msg=$(render --set "${bad%|*}" 2>&1); then fail "${bad%|*} was accepted"; fi
  echo "$msg" | has "${bad##*|}" || fail "schema error for ${bad%|*} does not name ${bad##*|}: $msg"
done

## unsafe combinations refused, each with its message; their safe neighbours render.
# Each: values (space-separated --set), then what the refusal must say, or "ok".
while IFS='|' read -r sets want; do
  [ -n "$sets" ] || continue
  args=()
  for s in $sets; do case $s in --*) args+=("$s") ;; *) args+=(--set "$s") ;; esac; done
  if msg=$(render "${args[@]}" 2>&1); then
    [ "$want" = ok ] || fail "$sets rendered; it must be refused with: $want"
  else
    [ "$want" != ok ] || fail "$sets was refused: $msg"
    echo "$msg" | has -F -- "$want" || fail "$sets: the refusal does not say \"$want\": $msg"
  fi
done <<'EOF'
controllerManager.leaderElection.enabled=false|leaderElection.enabled=false with controllerManager.replicas=2
controllerManager.leaderElection.enabled=false controllerManager.replicas=3|controllerManager.replicas=3: every replica would run the controllers at once
controllerManager.leaderElection.enabled=false controllerManager.replicas=1|ok
controllerManager.leaderElection.enabled=false controllerManager.enabled=false|ok
controllerManager.serviceCIDR.enabled=false controllerManager.podGC.enabled=false controllerManager.sysctlWebhook.enabled=false|an empty controller list
controllerManager.serviceCIDR.enabled=false controllerManager.podGC.enabled=false|ok
controllerManager.podGC.enabled=false controllerManager.sysctlWebhook.enabled=false|ok
nodeAgent.conntrack.enabled=false nodeAgent.sysctl.enabled=false|the node-agent would run on every node and do nothing
nodeAgent.conntrack.enabled=false nodeAgent.sysctl.enabled=false nodeAgent.enabled=false|ok
--api-versions=v1/Pod|this cluster serves no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy
--api-versions=v1/Pod controllerManager.ownObjectsOnly.enabled=false|nodeAgent.ownNodeOnly.enabled=true, but this cluster serves no
--api-versions=v1/Pod nodeAgent.ownNodeOnly.enabled=false|controllerManager.ownObjectsOnly.enabled=true, but this cluster serves no
--api-versions=v1/Pod nodeAgent.ownNodeOnly.enabled=false controllerManager.ownObjectsOnly.enabled=false|ok
--api-versions=v1/Pod --api-versions=admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy|ok
--api-versions=v1/Pod nodeAgent.enabled=false controllerManager.enabled=false|ok
EOF
# ServiceMonitor and PrometheusRule: rendered only where the cluster serves their CRDs; else
# nothing, and NOTES say so.
for kind in ServiceMonitor PodMonitor PrometheusRule; do
  key=$(echo "${kind:0:1}" | tr "[:upper:]" "[:lower:]")${kind:1}
  render --set "metrics.$key.enabled=true" | has "^kind: $kind$" && fail "$kind rendered without its CRD"
  render --set "metrics.$key.enabled=true" --api-versions "monitoring.coreos.com/v1/$kind" | has "^kind: $kind$" \
    || fail "$kind not rendered where its CRD is served"
  "$helm" install gk "$chart" -n groundskeeper --dry-run=client --set "metrics.$key.enabled=true" \
    | sed -n '/^NOTES:/,$p' | has "NOT RENDERED: metrics.$key.enabled=true" || fail "NOTES do not say the $kind was left out"
done

## the namespace and its Pod Security labels, only when asked.
names < "$out/t-default.yaml" | has "^Namespace " && fail "the default render has a Namespace"
render --set namespace.create=true --set-string namespace.labels.team=x | docs_of Namespace > "$out/t-ns.yaml"
for want in "^  name: groundskeeper$" "^    pod-security.kubernetes.io/enforce: privileged$" "^    team: x$" \
  "^    helm.sh/resource-policy: keep$"; do
  grep -q "$want" "$out/t-ns.yaml" || fail "namespace.create=true: the Namespace lacks $want"
done
render --set namespace.create=true --set podSecurity.label=false | docs_of Namespace | has "pod-security.kubernetes.io" \
  && fail "podSecurity.label=false still labels the namespace"
"$helm" install gk "$chart" -n groundskeeper --dry-run=client | sed -n '/^NOTES:/,$p' \
  | has "kubectl label namespace groundskeeper pod-security.kubernetes.io/enforce=privileged" \
  || fail "NOTES do not say how to let the namespace admit the node-agent"
# helm test's script, run here with a wget that no node-agent answers (and no real sleep): it
# fails naming the Pod Security cause; when only the controller-manager is down it does not.
# Over HTTPS (the default) the image under test asks, with the same hint for the node-agent.
render --show-only templates/tests/readyz.yaml > "$out/t-test-https.yaml"
for want in '      image: ghcr.io/groundskeeper-dev/groundskeeper:'"$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart/Chart.yaml")" \
  '      command: ["/usr/local/bin/controller-manager", "probe"]' \
  '        - https://gk-groundskeeper-node-agent-metrics:8080/readyz'; do
  has -xF -- "$want" "$out/t-test-https.yaml" || fail "helm test over https lacks '$want'"
done
has "violates PodSecurity' means namespace groundskeeper" "$out/t-test-https.yaml" || fail "helm test over https lost the Pod Security hint"
# Over HTTP, the test image's shell and wget:
render --set metrics.scheme=http --show-only templates/tests/readyz.yaml | sed -n '/^        - |$/,$p' | tail -n +2 | sed 's/^          //' > "$out/t-test.sh"
mkdir -p "$out/shims"
# shellcheck disable=SC2016
printf '#!/bin/sh
case "$*" in *"$DOWN"*) exit 1 ;; esac
' > "$out/shims/wget"
printf '#!/bin/sh
' > "$out/shims/sleep"
# shellcheck disable=SC2016
printf '#!/bin/sh
shift
exec "$@"
' > "$out/shims/timeout"
chmod +x "$out/shims/"*
sh=$(command -v sh)
if DOWN=node-agent PATH=$out/shims "$sh" "$out/t-test.sh" > "$out/t-test.out" 2>&1; then fail "helm test passed with no node-agent answering"; fi
has "violates PodSecurity' means namespace groundskeeper does not admit privileged pods" "$out/t-test.out" \
  || fail "helm test does not name a Pod Security refusal when no node-agent answers: $(cat "$out/t-test.out")"
if DOWN=controller-manager PATH=$out/shims "$sh" "$out/t-test.sh" > "$out/t-test.out" 2>&1; then fail "helm test passed with no controller-manager answering"; fi
has PodSecurity "$out/t-test.out" && fail "helm test blames Pod Security for the controller-manager"
DOWN=nothing PATH=$out/shims "$sh" "$out/t-test.sh" > "$out/t-test.out" 2>&1 || fail "helm test failed with both answering: $(cat "$out/t-test.out")"

## the CRD as a template, when asked, equal to crds/.
names < "$out/t-default.yaml" | has "^CustomResourceDefinition " && fail "crds.install=false (default) renders the CRD as a template"
render --set crds.install=true --show-only templates/crds.yaml > "$out/t-crd.yaml"
for crd in "$chart"/crds/*.yaml; do
  n=$(sed -n 's/^  name: //p' "$crd" | head -1)
  names < "$out/t-crd.yaml" | has -x "CustomResourceDefinition $n" || fail "crds.install=true does not render $n"
  if python3 -c 'import yaml' 2>/dev/null; then
    python3 - "$crd" "$out/t-crd.yaml" "$n" <<'PY' || fail "the templated CRD $n differs from $crd"
import sys, yaml
src = yaml.safe_load(open(sys.argv[1]))
got = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d and d["metadata"]["name"] == sys.argv[3]][0]
sys.exit(0 if src["spec"] == got["spec"] else 1)
PY
  else
    echo "chart: python3 has no yaml module: the templated CRD's spec is compared with crds/ only by the server dry-run"
  fi
done
grep -q "^    helm.sh/resource-policy: keep$" "$out/t-crd.yaml" || fail "crds.keep (default) does not add helm.sh/resource-policy: keep"
render --set crds.install=true --set crds.keep=false --show-only templates/crds.yaml | has "resource-policy" \
  && fail "crds.keep=false still keeps the CRD"
## beside kube-controller-manager (managed clusters): the preset and podGC.mode.
render -f "$chart/presets/managed-cluster.yaml" > "$out/t-managed.yaml"
# Of kube-controller-manager's controllers only PodGC; the sysctl placement is groundskeeper's own.
docs_of Deployment < "$out/t-managed.yaml" | has -- "- --controllers=podgc,sysctlplacement$" \
  || fail "the managed preset must run PodGC only of kube-controller-manager's controllers (and the sysctl placement)"
docs_of Deployment < "$out/t-managed.yaml" | has -- "- --terminated-pod-gc-threshold=0$" \
  || fail "podGC.mode=ttl-only must leave the threshold pass to kube-controller-manager"
docs_of Deployment < "$out/t-managed.yaml" | has -- "- --pod-gc-mode=ttl-only$" \
  || fail "podGC.mode=ttl-only must leave the out-of-service, orphaned and unscheduled passes to kube-controller-manager (--pod-gc-mode=ttl-only)"
docs_of Deployment < "$out/t-default.yaml" | has -- "- --pod-gc-mode=all$" \
  || fail "podGC.mode=all (the default) must run every pass (--pod-gc-mode=all)"
# The uninstall Job there only releases the pods the sysctl gate holds: it must not touch the
# ServiceCIDR finalizer (kube-controller-manager's), nor be allowed to.
docs_of Job < "$out/t-managed.yaml" | has -- "- --release-servicecidrs=false$" \
  || fail "the managed preset's uninstall Job would strip kube-controller-manager's ServiceCIDR finalizer"
render -f "$chart/presets/managed-cluster.yaml" --show-only templates/uninstall-hook.yaml | docs_of ClusterRole | has "servicecidrs" \
  && fail "the managed preset's uninstall Job may patch ServiceCIDRs: kube-controller-manager's finalizer is not ours"
render --set controllerManager.podGC.terminatedPodThreshold=77 | docs_of Deployment | has -- "- --terminated-pod-gc-threshold=77$" \
  || fail "podGC.mode=all must pass terminatedPodThreshold"
"$helm" install gk "$chart" -n groundskeeper --dry-run=client -f "$chart/presets/managed-cluster.yaml" | sed -n '/^NOTES:/,$p' > "$out/t-notes"
has "Running beside kube-controller-manager's controllers" "$out/t-notes" || fail "NOTES of the managed preset do not say it runs beside upstream"
has -- "--controllers=\*," "$out/t-notes" && fail "NOTES of the managed preset still ask to turn kube-controller-manager's controllers off"
if msg=$(render --set controllerManager.podGC.mode=sometimes 2>&1); then fail "podGC.mode=sometimes accepted"; fi
echo "$msg" | has mode || fail "schema error does not name mode: $msg"

## The node-agent's memory limit holds at Kubernetes' documented limits: the agent_scale bench's
## peak at 10k Services / 100k endpoints
## (docs/benchmarks.md#node-agent-conntrack-cleanup-at-10000-services-100000-endpoints) is well
## under it, with headroom for a cluster past those limits.
limit=$(docs_of DaemonSet < "$out/t-default.yaml" | sed -n 's/^ *memory: \([0-9]*\)Mi$/\1/p' | sort -n | tail -n 1)
[ "${limit:-0}" -ge 200 ] || fail "the node-agent's default memory limit (${limit:-none} Mi) is under 200 Mi: OOM-killed at 10k Services (see values.yaml)"

## RBAC by name: in the release namespace (kube-system, as values.yaml suggests, included) no
## Role rule reads or writes Leases or Secrets without resourceNames (a compromised
## controller-manager could otherwise take kube-scheduler's Lease or read every Secret there),
## no ClusterRole of ours names them at all, and create, which can not take resourceNames, is
## bounded by the chart's own-objects ValidatingAdmissionPolicy (check_cluster.sh proves it on an
## apiserver).
# "Kind: resources verbs" of each rule of a Role or ClusterRole that touches Leases or Secrets
# by a verb that resourceNames can limit and does not name them.
unnamed_grants() {
  awk 'function flush() {
      if (rule && res ~ /"(leases|secrets)"/ && ((kind == "Role" && verbs ~ /"(get|list|watch|update|patch|delete)"/ && !named) || kind == "ClusterRole"))
        print kind ": " res " " verbs
      rule = 0; res = ""; verbs = ""; named = 0
    }
    /^---/ { flush(); kind = ""; inrules = 0 }
    /^kind: / { kind = $2 }
    /^rules:/ { inrules = 1; next }
    /^[a-z]/ { flush(); inrules = 0 }
    inrules && /^  - / { flush(); rule = 1; sub(/^  - /, "    ") }
    inrules && rule && /^    resources:/ { res = $0 }
    inrules && rule && /^    resourceNames:/ { named = 1 }
    inrules && rule && /^    verbs:/ { verbs = $0 }
    END { flush() }'
}
for values in "" "-f $chart/ci/everything-on-values.yaml" "--set controllerManager.sysctlWebhook.certificates.source=cert-manager"; do
  for ns in groundskeeper kube-system; do
    # shellcheck disable=SC2086
    bad=$("$helm" template gk "$chart" -n "$ns" $values | unnamed_grants)
    [ -z "$bad" ] || fail "-n $ns $values: Leases or Secrets granted without resourceNames: $bad"
  done
done
# The check itself catches what it is for (a rule as the chart had it: update on every Lease).
printf 'kind: Role\nrules:\n  - apiGroups: ["coordination.k8s.io"]\n    resources: ["leases"]\n    verbs: ["get", "create", "update"]\n' \
  | unnamed_grants | has leases || fail "unnamed_grants misses an unnamed Lease update"
policy=$(render --show-only templates/controller-manager-own-objects.yaml)
for want in "resources: \[\"leases\"\]" "resources: \[\"secrets\"\]" "variables.name == 'groundskeeper-controller-manager'" \
  "variables.name == 'gk-groundskeeper-webhook-tls'" "system:serviceaccount:groundskeeper:gk-groundskeeper-controller-manager" \
  "validationActions: \[Deny\]"; do
  echo "$policy" | has -- "$want" || fail "the own-objects policy lacks: $want"
done
render --set controllerManager.ownObjectsOnly.enabled=false | names | has "^ValidatingAdmissionPolicy gk-groundskeeper-controller-manager-own-objects$" \
  && fail "ownObjectsOnly.enabled=false still renders the own-objects policy"

## images: one reference for every container, global.imageRegistry over each image's registry,
## pull secrets on every pod (the helm test's and the uninstall Job's too).
images() { sed -n 's/^ *image: //p'; }
[ "$(docs_of Deployment < "$out/t-default.yaml" | images)" = "ghcr.io/groundskeeper-dev/groundskeeper:0.1.0" ] \
  || fail "the default image is not ghcr.io/groundskeeper-dev/groundskeeper:<appVersion>"
render --set image.registry=registry.example.com:5000/mirror | docs_of DaemonSet | images | has -x "registry.example.com:5000/mirror/groundskeeper-dev/groundskeeper:0.1.0" \
  || fail "image.registry does not prefix the repository"
render --set image.registry= | docs_of Deployment | images | has -x "groundskeeper-dev/groundskeeper:0.1.0" || fail "image.registry= must leave the repository alone"
d=sha256:$(printf 'ab%.0s' $(seq 1 32))
render --set image.digest="$d" | docs_of Deployment | images | has -x "ghcr.io/groundskeeper-dev/groundskeeper@$d" || fail "image.digest without a tag"
render --set image.digest="$d" --set image.tag=1.2.3 | docs_of Deployment | images | has -x "ghcr.io/groundskeeper-dev/groundskeeper:1.2.3@$d" \
  || fail "image.digest with a tag must keep both"
# global.imageRegistry: every container of every pod, the test's and the Job's included (the
# extra containers of everything-on name their own images).
render -f "$chart/ci/everything-on-values.yaml" --set global.imageRegistry=mirror.example > "$out/t-mirror.yaml"
off=$(images < "$out/t-mirror.yaml" | grep -v "^mirror.example/\|^registry.example/tools/" || true)
[ -z "$off" ] || fail "global.imageRegistry does not reach: $off"
render --set global.imageRegistry=mirror.example --set metrics.scheme=http | images | sort -u | has -x "mirror.example/library/busybox:1.37" \
  || fail "global.imageRegistry does not reach the helm test's image"
pods=$(render --set 'global.imagePullSecrets={a,b}' --set 'imagePullSecrets[0].name=b' --set 'imagePullSecrets[1]=c' | awk '
  /^---/{k=""} /^kind: /{k=$2} /imagePullSecrets:$/{n[k]++; on=1; next} on&&/- name: /{s[k]=s[k] $3 ","; next} {on=0}
  END{for (k in n) print k, n[k], s[k]}' | sort)
[ "$pods" = "$(printf 'DaemonSet 1 a,b,c,\nDeployment 1 a,b,c,\nJob 1 a,b,c,\nPod 1 a,b,c,')" ] \
  || fail "pull secrets (global first, no repeats) on every pod: got $pods"
has "imagePullSecrets" "$out/t-default.yaml" && fail "no pull secrets set, yet imagePullSecrets rendered"
while IFS='|' read -r bad want; do
  if msg=$(render --set "$bad" 2>&1); then fail "$bad was accepted"; fi
  echo "$msg" | has -F -- "$want" || fail "$bad: the refusal does not say \"$want\": $msg"
done <<'EOF'
image.repository=ghcr.io/groundskeeper-dev/groundskeeper|image.repository=ghcr.io/groundskeeper-dev/groundskeeper starts with a registry (ghcr.io): give the registry as image.registry=ghcr.io
tests.image.repository=localhost/busybox|tests.image.repository=localhost/busybox starts with a registry (localhost)
tests.image.repository=registry.example.com:5000/busybox|tests/image/repository
image.repository=groundskeeper:1.0|repository
global.imageRegistry=https://mirror|imageRegistry
imagePullSecrets[0].nam=x|imagePullSecrets
EOF

## the workloads' knobs, each where it belongs; the defaults render what Kubernetes would default.
knob() { # KIND WANT ARGS...: a KIND document rendered with ARGS has a line WANT (grep -x)
  local kind=$1 want=$2; shift 2
  render "$@" | docs_of "$kind" | has -x -- "$want" || fail "$*: no $kind line '$want'"
}
for w in "Deployment controllerManager" "DaemonSet nodeAgent"; do
  kind=${w% *} v=${w#* }
  knob "$kind" "  revisionHistoryLimit: 3" --set "$v.revisionHistoryLimit=3"
  render --set "$v.annotations.team\.example/owner=x" | docs_of "$kind" | sed -n '/^metadata:/,/^spec:/p' | has -x "    team.example/owner: x" \
    || fail "$v.annotations not on the $kind"
  knob "$kind" "      terminationGracePeriodSeconds: 77" --set "$v.terminationGracePeriodSeconds=77"
  knob "$kind" "        - name: ndots" --set "$v.dnsConfig.options[0].name=ndots"
  render --set "$v.livenessProbe.timeoutSeconds=7" | docs_of "$kind" | sed -n '/^          livenessProbe:/,/^          [a-z]/p' \
    | has -x "            timeoutSeconds: 7" || fail "$v.livenessProbe.timeoutSeconds not on the liveness probe"
  render --set "$v.readinessProbe.successThreshold=2" | docs_of "$kind" | sed -n '/^          readinessProbe:/,/^          [a-z]/p' \
    | has -x "            successThreshold: 2" || fail "$v.readinessProbe.successThreshold not on the readiness probe"
  docs_of "$kind" < "$out/t-default.yaml" | has startupProbe && fail "a startupProbe by default on the $kind"
  render --set "$v.startupProbe.enabled=true" --set "$v.startupProbe.failureThreshold=9" | docs_of "$kind" \
    | sed -n '/^          startupProbe:/,/^          [a-z]/p' > "$out/t-startup"
  has -x "            failureThreshold: 9" "$out/t-startup" && has -x "            httpGet: {path: /healthz, port: metrics, scheme: HTTPS}" "$out/t-startup" \
    && ! has enabled "$out/t-startup" || fail "$v.startupProbe: $(cat "$out/t-startup")"
  render --set "$v.extraContainers[0].name=side" --set "$v.extraContainers[0].image=x/y:1" --set "$v.extraInitContainers[0].name=first" \
    --set "$v.extraInitContainers[0].image=x/z:1" | docs_of "$kind" > "$out/t-extra"
  awk '/^      containers:/{c=1} /^      initContainers:/{c=0} c && /^        (- |  )name: side$/{f=1} END{exit !f}' "$out/t-extra" \
    || fail "$v.extraContainers not among the containers"
  awk '/^      initContainers:/{i=1} /^      containers:/{i=0} i && /^        (- |  )name: first$/{f=1} END{exit !f}' "$out/t-extra" \
    || fail "$v.extraInitContainers not among the init containers"
  if msg=$(render --set "$v.extraContainers[0].name=side" 2>&1); then fail "$v.extraContainers without an image accepted"; fi
  echo "$msg" | has image || fail "$v.extraContainers without an image: the refusal does not name image: $msg"
done
# The node-agent's own init container and the extra ones share one list.
render --set nodeAgent.conntrack.sysctls.min=1 --set 'nodeAgent.extraInitContainers[0].name=first' --set 'nodeAgent.extraInitContainers[0].image=x' \
  | docs_of DaemonSet | grep -c "^      initContainers:$" | has -x 1 || fail "two initContainers lists in the DaemonSet"
knob DaemonSet "    type: OnDelete" --set nodeAgent.updateStrategy.type=OnDelete
render --set nodeAgent.updateStrategy.type=OnDelete | docs_of DaemonSet | has rollingUpdate && fail "OnDelete with a rollingUpdate"
knob Service "    team.example/owner: x" --set "metrics.service.annotations.team\.example/owner=x"
render --set "controllerManager.sysctlWebhook.service.annotations.team\.example/owner=x" --show-only templates/sysctl-webhook.yaml \
  | docs_of Service | has -x "    team.example/owner: x" || fail "sysctlWebhook.service.annotations not on the webhook Service"
# The webhook on the host network: the node's ports, ClusterFirstWithHostNet, the Service still
# pointing at the webhook port by name.
render --set controllerManager.hostNetwork=true --set controllerManager.sysctlWebhook.port=10260 --set controllerManager.adminPort=10262 > "$out/t-host.yaml"
for want in "      hostNetwork: true" "      dnsPolicy: ClusterFirstWithHostNet" "            - --webhook-addr=0.0.0.0:10260" \
  "              containerPort: 10260" "            - --admin-addr=0.0.0.0:10262" "              containerPort: 10262"; do
  docs_of Deployment < "$out/t-host.yaml" | has -x -- "$want" || fail "controllerManager.hostNetwork: the Deployment lacks '$want'"
done
docs_of Service < "$out/t-host.yaml" | has -x "      targetPort: webhook" || fail "the webhook Service does not target the webhook port by name"
docs_of Deployment < "$out/t-default.yaml" | has "hostNetwork\|dnsPolicy" && fail "the controller-manager is on the host network by default"
# Leader election: the timings reach the binary (controllers/tests/chart_args.rs parses them).
for want in "--leader-elect-lease-duration=30s" "--leader-elect-renew-deadline=20s" "--leader-elect-retry-period=3s"; do
  knob Deployment "            - $want" --set controllerManager.leaderElection.leaseDuration=30s \
    --set controllerManager.leaderElection.renewDeadline=20s --set controllerManager.leaderElection.retryPeriod=3s
done
for want in "--leader-elect-lease-duration=15s" "--leader-elect-renew-deadline=10s" "--leader-elect-retry-period=2s"; do
  docs_of Deployment < "$out/t-default.yaml" | has -x -- "            - $want" || fail "the default leader-election timings changed: no $want"
done
while IFS='|' read -r sets want; do
  args=(); for s in $sets; do args+=(--set "$s"); done
  if msg=$(render "${args[@]}" 2>&1); then fail "$sets was accepted"; fi
  echo "$msg" | has -F -- "$want" || fail "$sets: the refusal does not say \"$want\": $msg"
done <<'EOF'
nodeAgent.updateStrategy.maxSurge=1|nodeAgent.updateStrategy.maxSurge=1: the node-agent holds port 9846
nodeAgent.updateStrategy.maxSurge=10%|a surge pod can never start beside the old one
nodeAgent.updateStrategy.type=Sometimes|type
controllerManager.adminPort=9443|controllerManager.adminPort and controllerManager.sysctlWebhook.port are both 9443
controllerManager.hostNetwork=true networkPolicy.enabled=true|network plugins do not apply NetworkPolicies to host-network pods
controllerManager.leaderElection.renewDeadline=15s|leaseDuration=15s must exceed renewDeadline=15s by at least 1s
controllerManager.leaderElection.leaseDuration=10500ms|leaseDuration=10500ms must exceed renewDeadline=10s
controllerManager.leaderElection.retryPeriod=10s|renewDeadline=10s must be greater than retryPeriod=10s
controllerManager.leaderElection.retryPeriod=1.5s|retryPeriod
controllerManager.livenessProbe.successThreshold=2|successThreshold
controllerManager.startupProbe.handler=x|handler
EOF
# The neighbours that must render: a margin of exactly 1s, the webhook off (its port then unused).
render --set controllerManager.leaderElection.leaseDuration=11s >/dev/null || fail "a 1s lease margin was refused"
render --set controllerManager.adminPort=9443 --set controllerManager.sysctlWebhook.enabled=false >/dev/null || fail "adminPort 9443 refused with the webhook off"

## monitoring: scrape settings, PodMonitor, the node-agent's token by authorization, alerts.
mon=(--api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PodMonitor
  --api-versions monitoring.coreos.com/v1/PrometheusRule)
render "${mon[@]}" -f "$chart/ci/everything-on-values.yaml" > "$out/t-mon.yaml"
[ "$(grep -c "^kind: ServiceMonitor$" "$out/t-mon.yaml")" = 2 ] || fail "one ServiceMonitor per component"
for want in "      scheme: https" "      interval: 15s" "      scrapeTimeout: 10s" "        insecureSkipVerify: true" \
  "          targetLabel: node" "        - action: drop"; do
  [ "$(docs_of ServiceMonitor < "$out/t-mon.yaml" | grep -cx -- "$want")" = 2 ] || fail "not on both ServiceMonitors: '$want'"
done
has bearerTokenFile "$out/t-mon.yaml" && fail "bearerTokenFile (deprecated) still rendered"
# Both endpoints carry the token (both binaries check it by default), from the Secret of the
# scraper account the chart binds to metrics-reader.
[ "$(grep -c "^      authorization:$" "$out/t-mon.yaml")" = 2 ] || fail "authorization must be on both endpoints"
[ "$(docs_of ServiceMonitor < "$out/t-mon.yaml" | grep -cx "          name: gk-keeper-metrics-scraper-token")" = 2 ] \
  || fail "the ServiceMonitors do not name the scraper's token Secret"
docs_of Secret < "$out/t-mon.yaml" | has -x "type: kubernetes.io/service-account-token" || fail "no token Secret for the scraper"
docs_of ClusterRoleBinding < "$out/t-mon.yaml" | awk '/^---/{p=0} /name: gk-keeper-metrics-scraper$/{p=1} p' | has -x "  name: gk-keeper-metrics-reader" \
  || fail "the scraper is not bound to metrics-reader"
render "${mon[@]}" --set metrics.serviceMonitor.enabled=true --set metrics.scrapeToken.create=false --set metrics.scrapeToken.secretName=mine \
  --set metrics.scrapeToken.key=t > "$out/t-own.yaml"
names < "$out/t-own.yaml" | has "metrics-scraper" && fail "scrapeToken.create=false still creates the scraper"
docs_of ServiceMonitor < "$out/t-own.yaml" | has -x "          name: mine" && docs_of ServiceMonitor < "$out/t-own.yaml" | has -x "          key: t" \
  || fail "scrapeToken.secretName/key not in the ServiceMonitor"
render "${mon[@]}" --set metrics.serviceMonitor.enabled=true --set nodeAgent.metricsAuth=none > "$out/t-one-auth.yaml"
docs_of ServiceMonitor < "$out/t-one-auth.yaml" | awk '/^kind:/{k=0} /component: node-agent$/{k=1} k' | has "authorization:" \
  && fail "nodeAgent.metricsAuth=none still sends the node-agent a token"
docs_of ServiceMonitor < "$out/t-one-auth.yaml" | awk '/^kind:/{k=0} /component: controller-manager$/{k=1} k' | has "authorization:" \
  || fail "nodeAgent.metricsAuth=none took the controller-manager's token away"
render "${mon[@]}" --set metrics.serviceMonitor.enabled=true --set nodeAgent.metricsAuth=none --set controllerManager.metricsAuth=none \
  | has "authorization:\|metrics-scraper" && fail "metricsAuth=none on both still sends a token or creates the scraper"
names < "$out/t-default.yaml" | has "metrics-scraper" && fail "the scraper exists with no monitor"
# PodMonitor: the pods' port, no Service needed.
render "${mon[@]}" --set metrics.podMonitor.enabled=true --set metrics.service.enabled=false --set metrics.podMonitor.scrapeTimeout=5s \
  --set 'metrics.podMonitor.relabelings[0].targetLabel=x' > "$out/t-pod.yaml"
[ "$(grep -c "^kind: PodMonitor$" "$out/t-pod.yaml")" = 2 ] || fail "one PodMonitor per component"
for want in "  podMetricsEndpoints:" "    - port: metrics" "      scrapeTimeout: 5s" "        - targetLabel: x" "      scheme: https" \
  "        insecureSkipVerify: true"; do
  docs_of PodMonitor < "$out/t-pod.yaml" | has -x -- "$want" || fail "the PodMonitor lacks '$want'"
done
has "^kind: ServiceMonitor$" "$out/t-pod.yaml" && fail "a ServiceMonitor with only podMonitor enabled"
# Alerts: some left out, one of the admin's added, runbooks at the chart's own version.
render "${mon[@]}" --set metrics.prometheusRule.enabled=true > "$out/t-rule.yaml"
grep "runbook_url:" "$out/t-rule.yaml" | grep -v "https://github.com/groundskeeper-dev/groundskeeper/blob/v0.1.0/docs/runbook.md#" \
  && fail "runbook links not pinned to the chart's version"
# The names disabledAlerts accepts are the chart's alerts (GroundskeeperControllerManagerAbsent
# replaces GroundskeeperNoLeader without leader election).
alerts=$(sed -n 's/^ *- alert: //p' "$out/t-rule.yaml" | sort)
accepted=$(python3 -c 'import json,sys; print("\n".join(sorted(json.load(open(sys.argv[1]))["properties"]["metrics"]["properties"]["prometheusRule"]["properties"]["disabledAlerts"]["items"]["enum"])))' "$chart/values.schema.json")
[ "$(printf '%s\nGroundskeeperControllerManagerAbsent' "$alerts" | sort)" = "$accepted" ] \
  || fail "disabledAlerts accepts other names than the chart's alerts: $accepted"
render "${mon[@]}" --set metrics.prometheusRule.enabled=true --set 'metrics.prometheusRule.disabledAlerts={GroundskeeperWatchStale,GroundskeeperNoLeader}' \
  --set 'metrics.prometheusRule.additionalRules[0].record=gk:x' --set 'metrics.prometheusRule.additionalRules[0].expr=1' > "$out/t-rule2.yaml"
has "alert: GroundskeeperWatchStale$\|alert: GroundskeeperNoLeader$" "$out/t-rule2.yaml" && fail "disabledAlerts still rendered"
[ "$(grep -c -- "- alert: " "$out/t-rule2.yaml")" = $(($(echo "$alerts" | wc -l) - 2)) ] || fail "disabledAlerts removed other alerts too"
has -x "    - name: groundskeeper-additional" "$out/t-rule2.yaml" && has -x "        - expr: 1" "$out/t-rule2.yaml" \
  || fail "additionalRules not rendered"
render "${mon[@]}" --set metrics.prometheusRule.enabled=true --set metrics.prometheusRule.runbookBaseURL=https://r.example/rb.md \
  | has "runbook_url: https://r.example/rb.md#groundskeepernoleader$" || fail "runbookBaseURL not used"
while IFS='|' read -r sets want; do
  args=(); for s in $sets; do args+=(--set "$s"); done
  if msg=$(render "${mon[@]}" "${args[@]}" 2>&1); then fail "$sets was accepted"; fi
  echo "$msg" | has -F -- "$want" || fail "$sets: the refusal does not say \"$want\": $msg"
done <<'EOF'
metrics.serviceMonitor.enabled=true metrics.podMonitor.enabled=true|Prometheus would scrape every target twice
metrics.serviceMonitor.enabled=true metrics.service.enabled=false|a ServiceMonitor selects the metrics Services
metrics.podMonitor.enabled=true metrics.scrapeToken.create=false|no metrics.scrapeToken.secretName
metrics.scrapeToken.secretName=mine|metrics.scrapeToken.secretName=mine with metrics.scrapeToken.create=true
metrics.serviceMonitor.scheme=ftp|scheme
metrics.podMonitor.scrapeTimeout=soon|scrapeTimeout
metrics.prometheusRule.disabledAlerts={GroundskeeperNoSuchAlert}|disabledAlerts
metrics.prometheusRule.additionalRules[0].expr=1|additionalRules
EOF
render --set metrics.podMonitor.enabled=true --set metrics.scrapeToken.create=false --set nodeAgent.metricsAuth=none \
  --set controllerManager.metricsAuth=none >/dev/null || fail "no token is needed with metricsAuth=none"

## admin servers: HTTPS and token-checked by default on both, the probes and monitors following.
for kind in Deployment DaemonSet; do
  docs_of $kind < "$out/t-default.yaml" > "$out/t-admin.yaml"
  for want in "            - --admin-scheme=https" "            - --metrics-auth=kubernetes"; do
    has -x -- "$want" "$out/t-admin.yaml" || fail "the $kind lacks '$want' by default"
  done
  [ "$(grep -c "port: metrics, scheme: HTTPS}" "$out/t-admin.yaml")" = 2 ] || fail "the $kind's probes are not HTTPS"
  has admin-tls "$out/t-admin.yaml" && fail "the $kind mounts a certificate no value named"
done
docs_of ClusterRole < "$out/t-default.yaml" | awk '/^kind:/{k=0} /component: controller-manager$/{k=1} k' | has 'resources: \["tokenreviews"\]' \
  || fail "the controller-manager may not create the TokenReviews its /metrics check needs"
render --set metrics.scheme=http "${mon[@]}" --set metrics.serviceMonitor.enabled=true > "$out/t-http.yaml"
has -- "--admin-scheme=https\|scheme: HTTPS\|insecureSkipVerify" "$out/t-http.yaml" && fail "metrics.scheme=http still serves or scrapes https"
[ "$(grep -c -- "- --admin-scheme=http$" "$out/t-http.yaml")" = 2 ] || fail "metrics.scheme=http not passed to both binaries"
[ "$(docs_of ServiceMonitor < "$out/t-http.yaml" | grep -cx "      scheme: http")" = 2 ] || fail "the monitors do not follow metrics.scheme"
render --set metrics.tls.secretName=admin-cert > "$out/t-cert.yaml"
for kind in Deployment DaemonSet; do
  for want in "            - --admin-tls-cert-file=/etc/groundskeeper/admin-tls/tls.crt" \
    "            - --admin-tls-private-key-file=/etc/groundskeeper/admin-tls/tls.key" \
    "            - {name: admin-tls, mountPath: /etc/groundskeeper/admin-tls, readOnly: true}" \
    "        - {name: admin-tls, secret: {secretName: admin-cert}}"; do
    docs_of $kind < "$out/t-cert.yaml" | has -x -- "$want" || fail "metrics.tls.secretName: the $kind lacks '$want'"
  done
done
render --set controllerManager.metricsAuth=none > "$out/t-noauth.yaml"
docs_of Deployment < "$out/t-noauth.yaml" | has -x -- "            - --metrics-auth=none" || fail "controllerManager.metricsAuth=none not passed"
docs_of ClusterRole < "$out/t-noauth.yaml" | awk '/^kind:/{k=0} /component: controller-manager$/{k=1} k' | has tokenreviews \
  && fail "the controller-manager keeps TokenReviews with metricsAuth=none"
for bad in metrics.scheme=ftp controllerManager.metricsAuth=basic; do
  render --set "$bad" >/dev/null 2>&1 && fail "$bad accepted"
done

echo "chart: conventions table passed (names, labels, service accounts, refusals, monitoring CRDs, namespace, CRD template, managed-cluster preset, RBAC by name, images and pull secrets, workload knobs, monitoring knobs)"
