{{/* The chart's name, as `helm create` makes it: nameOverride wins, at most 63 characters. */}}
{{- define "groundskeeper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's prefix for every object, as `helm create` makes it: fullnameOverride wins;
else <release>-<name>, or the release name alone when it already contains the name. */}}
{{- define "groundskeeper.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<suffix>: include with (list $ "suffix"). At most 63 characters (a Service name
is a DNS label): a longer one keeps its first 54 and 8 hex digits of the whole one's sha256, so
two long names that share their first 63 characters still differ. Short names are unchanged. */}}
{{- define "groundskeeper.componentName" -}}
{{- $n := printf "%s-%s" (include "groundskeeper.fullname" (index . 0)) (index . 1) -}}
{{- if gt (len $n) 63 -}}
{{- printf "%s-%s" ($n | trunc 54 | trimSuffix "-") ($n | sha256sum | trunc 8) -}}
{{- else -}}
{{- $n -}}
{{- end -}}
{{- end -}}

{{/* A workload's ServiceAccount: include with (list $ "controller-manager" $values.serviceAccount).
As `helm create`: the name given, else <fullname>-<component> when the chart creates it, else
"default". */}}
{{- define "groundskeeper.serviceAccountName" -}}
{{- $sa := index . 2 -}}
{{- if $sa.create -}}
{{- default (include "groundskeeper.componentName" (list (index . 0) (index . 1))) $sa.name -}}
{{- else -}}
{{- default "default" $sa.name -}}
{{- end -}}
{{- end -}}

{{- define "groundskeeper.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "groundskeeper.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "node-agent"). */}}
{{- define "groundskeeper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "groundskeeper.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference, the one helper every container's image goes through: include with
(dict "image" <an image's values> "ctx" $ "defaultTag" <tag when the values give none>).
global.imageRegistry, when set, takes the place of the image's own registry (as kube-state-metrics
and cert-manager do); a digest pins the image, and a tag given beside it stays for readers. */}}
{{- define "groundskeeper.imageRef" -}}
{{- $img := .image -}}
{{- $global := .ctx.Values.global | default dict -}}
{{- $registry := $global.imageRegistry | default $img.registry -}}
{{- $name := $img.repository -}}
{{- with $registry }}{{ $name = printf "%s/%s" (trimSuffix "/" .) $name }}{{ end -}}
{{- if $img.digest -}}
{{- if $img.tag }}{{ $name }}:{{ $img.tag }}@{{ $img.digest }}{{ else }}{{ $name }}@{{ $img.digest }}{{ end -}}
{{- else -}}
{{ $name }}:{{ $img.tag | default .defaultTag }}
{{- end -}}
{{- end -}}

{{/* groundskeeper's image (both binaries). */}}
{{- define "groundskeeper.image" -}}
{{ include "groundskeeper.imageRef" (dict "image" .Values.image "ctx" . "defaultTag" .Chart.AppVersion) }}
{{- end -}}

{{/* The imagePullSecrets of every pod: global.imagePullSecrets, then imagePullSecrets, each a
name or a {name: ...} object, without repeats. Empty when there are none. */}}
{{- define "groundskeeper.imagePullSecrets" -}}
{{- $all := list -}}
{{- $global := .Values.global | default dict -}}
{{- range concat ($global.imagePullSecrets | default list) (.Values.imagePullSecrets | default list) -}}
{{- $s := . -}}
{{- if kindIs "string" . }}{{ $s = dict "name" . }}{{ end -}}
{{- if not (has $s $all) }}{{ $all = append $all $s }}{{ end -}}
{{- end -}}
{{- with $all -}}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* A duration of the form the schema allows for the leader-election timings (a whole number of
ms, s or m), in milliseconds, for the chart's comparisons. */}}
{{- define "groundskeeper.milliseconds" -}}
{{- $d := toString . -}}
{{- if hasSuffix "ms" $d -}}{{ trimSuffix "ms" $d | int64 }}
{{- else if hasSuffix "s" $d -}}{{ mul (trimSuffix "s" $d | int64) 1000 }}
{{- else if hasSuffix "m" $d -}}{{ mul (trimSuffix "m" $d | int64) 60000 }}
{{- end -}}
{{- end -}}

{{- define "groundskeeper.commonArgs" -}}
- --admin-scheme={{ .Values.metrics.scheme }}
{{- if and (eq .Values.metrics.scheme "https") .Values.metrics.tls.secretName }}
- --admin-tls-cert-file=/etc/groundskeeper/admin-tls/tls.crt
- --admin-tls-private-key-file=/etc/groundskeeper/admin-tls/tls.key
{{- end }}
- --log-format={{ .Values.logFormat }}
- --log-level={{ .Values.logLevel }}
- --kube-api-qps={{ .Values.kubeApi.qps }}
- --kube-api-burst={{ .Values.kubeApi.burst }}
{{- end -}}

{{/* True when any conntrack sysctl is set: a privileged init container then writes them. */}}
{{- define "groundskeeper.conntrackSysctlsSet" -}}
{{- $set := false -}}
{{- range $k, $v := .Values.nodeAgent.conntrack.sysctls -}}
{{- if not (kindIs "invalid" $v) -}}{{- $set = true -}}{{- end -}}
{{- end -}}
{{- if and .Values.nodeAgent.conntrack.enabled $set -}}true{{- end -}}
{{- end -}}

{{/* A workload's probes, on its admin port "metrics": include with the workload's values
(controllerManager or nodeAgent). The handlers are the chart's; the timings are the values'. */}}
{{/* The probes of a component: (list $ $componentValues). kubelet does not verify the
certificate of an HTTPS probe. */}}
{{- define "groundskeeper.probes" -}}
{{- $scheme := (index . 0).Values.metrics.scheme | upper -}}
{{- $c := index . 1 -}}
livenessProbe:
  httpGet: {path: /healthz, port: metrics, scheme: {{ $scheme }}}
  {{- with $c.livenessProbe }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
readinessProbe:
  httpGet: {path: /readyz, port: metrics, scheme: {{ $scheme }}}
  {{- with $c.readinessProbe }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- if $c.startupProbe.enabled }}
# Holds the probes above off until /healthz first answers.
startupProbe:
  httpGet: {path: /healthz, port: metrics, scheme: {{ $scheme }}}
  {{- with omit $c.startupProbe "enabled" }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "groundskeeper.controllers" -}}
{{- $c := list -}}
{{- if .Values.controllerManager.serviceCIDR.enabled }}{{ $c = append $c "servicecidr" }}{{ end -}}
{{- if .Values.controllerManager.podGC.enabled }}{{ $c = append $c "podgc" }}{{ end -}}
{{- if include "groundskeeper.placementEnabled" . }}{{ $c = append $c "sysctlplacement" }}{{ end -}}
{{- join "," $c -}}
{{- end -}}

{{/* The terminated-pod threshold passed to the binary: 0 (pass off) in podGC.mode ttl-only,
where kube-controller-manager's own threshold pass runs. */}}
{{- define "groundskeeper.podgcThreshold" -}}
{{- if eq .Values.controllerManager.podGC.mode "ttl-only" -}}0{{- else -}}{{ .Values.controllerManager.podGC.terminatedPodThreshold }}{{- end -}}
{{- end -}}

{{- define "groundskeeper.nodeTasks" -}}
{{- $t := list -}}
{{- if .Values.nodeAgent.conntrack.enabled }}{{ $t = append $t "conntrack" }}{{ end -}}
{{- if .Values.nodeAgent.sysctl.enabled }}{{ $t = append $t "sysctl" }}{{ end -}}
{{- join "," $t -}}
{{- end -}}

{{/* The sysctl webhook's Service, the name the apiserver calls, its Secret and configuration. */}}
{{- define "groundskeeper.webhookService" -}}
{{ include "groundskeeper.componentName" (list . "webhook") }}
{{- end -}}

{{- define "groundskeeper.webhookHost" -}}
{{ include "groundskeeper.webhookService" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{- define "groundskeeper.webhookSecret" -}}
{{ include "groundskeeper.componentName" (list . "webhook-tls") }}
{{- end -}}

{{- define "groundskeeper.webhookConfiguration" -}}
{{ include "groundskeeper.componentName" (list . "sysctl") }}
{{- end -}}

{{/* "true" when the sysctl scheduling gate and its placement controller are rendered. */}}
{{- define "groundskeeper.gateEnabled" -}}
{{- $wh := .Values.controllerManager.sysctlWebhook -}}
{{- if and .Values.controllerManager.enabled $wh.enabled $wh.gate.enabled -}}true{{- end -}}
{{- end -}}

{{/* "true" when the placement controller runs: wherever the sysctl webhook does, the gate on or
off, so that turning the gate off releases the pods it already holds (each placed as usual, or
let go un-narrowed where nothing enforces) instead of stranding them. */}}
{{- define "groundskeeper.placementEnabled" -}}
{{- if and .Values.controllerManager.enabled .Values.controllerManager.sysctlWebhook.enabled -}}true{{- end -}}
{{- end -}}

{{/* The controller-manager's user name, as the apiserver authenticates its ServiceAccount. */}}
{{- define "groundskeeper.controllerManagerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "groundskeeper.serviceAccountName" (list . "controller-manager" .Values.controllerManager.serviceAccount) }}
{{- end -}}

{{/* The safe sysctls every supported kubelet (v1.33 on) allows on every Linux kernel: those
without a kernel gate (sysctl-rules' Kubelet::OLDEST.safe_sysctls(None); controllers/tests/chart_args.rs checks
the two agree). A pod that sets only these is allowed on every node whatever the policies, so no
sysctl webhook sees it: an outage of groundskeeper can not affect it. */}}
{{- define "groundskeeper.safeEverywhere" -}}
['kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range', 'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range', 'net.ipv4.ip_unprivileged_port_start']
{{- end -}}

{{/* The MutatingWebhookConfiguration of the sysctl scheduling gate. */}}
{{- define "groundskeeper.gateConfiguration" -}}
{{ include "groundskeeper.componentName" (list . "sysctl-gate") }}
{{- end -}}

{{/* What the webhooks share: include with (dict "ctx" $ "path" "/validate/..."), and
"failurePolicy" to override sysctlWebhook.failurePolicy (the gate's own). */}}
{{- define "groundskeeper.webhookCommon" -}}
{{- $wh := .ctx.Values.controllerManager.sysctlWebhook -}}
clientConfig:
  service:
    name: {{ include "groundskeeper.webhookService" .ctx }}
    namespace: {{ .ctx.Release.Namespace }}
    path: {{ .path }}
    port: 443
failurePolicy: {{ .failurePolicy | default $wh.failurePolicy }}
timeoutSeconds: {{ $wh.timeoutSeconds }}
sideEffects: None
admissionReviewVersions: ["v1"]
# Never the control plane's own namespace or groundskeeper's: neither waits for the webhook.
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        - kube-system
        - {{ .ctx.Release.Namespace }}
        {{- range $wh.exemptNamespaces }}
        - {{ . }}
        {{- end }}
{{- end -}}

{{/* "true" when the cluster is known not to serve ValidatingAdmissionPolicy. Kind-level entries
(group/version/Kind) come from a cluster's discovery (helm install/upgrade, Argo CD); `helm
template` without --api-versions knows only group/versions, and there the chart's kubeVersion
(>= 1.33, where the policy is GA and on) stands for it. */}}
{{- define "groundskeeper.vapMissing" -}}
{{- $caps := .Capabilities.APIVersions -}}
{{- $discovered := $caps.Has "v1/Pod" -}}
{{- if and $discovered (not ($caps.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")) -}}true{{- end -}}
{{- end -}}

{{/* "true" when the Prometheus Operator's CRD for the kind given is served: include with
(list $ "ServiceMonitor"). Without it the object is not rendered and NOTES say so. */}}
{{- define "groundskeeper.hasMonitoring" -}}
{{- if (index . 0).Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" (index . 1)) -}}true{{- end -}}
{{- end -}}

{{/* Where the ServiceMonitors or PodMonitors live (metrics.*.namespace, default the release's),
and with them the scraper's account and token Secret: the Prometheus Operator reads a monitor's
Secrets from the monitor's own namespace. */}}
{{- define "groundskeeper.monitorNamespace" -}}
{{- $m := .Values.metrics -}}
{{- if $m.podMonitor.enabled -}}
{{ $m.podMonitor.namespace | default .Release.Namespace }}
{{- else -}}
{{ $m.serviceMonitor.namespace | default .Release.Namespace }}
{{- end -}}
{{- end -}}

{{/* The Secret holding the token the monitors scrape the node-agent with. */}}
{{- define "groundskeeper.scrapeTokenSecret" -}}
{{- if .Values.metrics.scrapeToken.create -}}
{{ include "groundskeeper.componentName" (list . "metrics-scraper-token") }}
{{- else -}}
{{ .Values.metrics.scrapeToken.secretName }}
{{- end -}}
{{- end -}}

{{/* One scrape endpoint of a ServiceMonitor or PodMonitor: include with (dict "ctx" $ "monitor"
<metrics.serviceMonitor or metrics.podMonitor> "component" <component>). */}}
{{/* "true" when a component's /metrics asks for a token: (list $ component). */}}
{{- define "groundskeeper.metricsAuth" -}}
{{- $v := (index . 0).Values -}}
{{- $auth := ternary $v.controllerManager.metricsAuth $v.nodeAgent.metricsAuth (eq (index . 1) "controller-manager") -}}
{{- if eq $auth "kubernetes" }}true{{ end -}}
{{- end -}}

{{/* The admin-tls volume and its mount, with metrics.tls.secretName over https. */}}
{{- define "groundskeeper.adminTLS" -}}
{{- if and (eq .Values.metrics.scheme "https") .Values.metrics.tls.secretName }}true{{ end -}}
{{- end -}}

{{- define "groundskeeper.scrapeEndpoint" -}}
{{- $m := .monitor -}}
{{- $ctx := .ctx -}}
{{- $scheme := $m.scheme | default $ctx.Values.metrics.scheme -}}
port: metrics
path: /metrics
scheme: {{ $scheme }}
interval: {{ $m.interval }}
{{- if $m.honorLabels }}
# The scraped series' own labels win over the target's on a clash.
honorLabels: true
{{- end }}
{{- with $m.scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
{{- if eq $scheme "https" }}
tlsConfig:
  {{- toYaml ($m.tlsConfig | default (dict "insecureSkipVerify" true)) | nindent 2 }}
{{- end }}
{{- if include "groundskeeper.metricsAuth" (list $ctx .component) }}
# --metrics-auth=kubernetes: a token whose user may get /metrics (metrics.scrapeToken).
authorization:
  type: Bearer
  credentials:
    name: {{ include "groundskeeper.scrapeTokenSecret" $ctx }}
    key: {{ $ctx.Values.metrics.scrapeToken.key }}
{{- end }}
{{- with $m.relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A pod's nodeSelector: kubernetes.io/os: linux (the image holds Linux binaries only) and the
node labels given (include with a workload's nodeSelector values, or an empty dict). linux wins
over another kubernetes.io/os. */}}
{{- define "groundskeeper.nodeSelector" -}}
nodeSelector:
  {{- toYaml (merge (dict "kubernetes.io/os" "linux") (. | default dict)) | nindent 2 }}
{{- end -}}

{{/* A Service's IP families, from its values (metrics.service or
controllerManager.sysctlWebhook.service): nothing where they are unset, so the cluster's default
(SingleStack, the first ServiceCIDR's family) applies. */}}
{{- define "groundskeeper.serviceIPFamilies" -}}
{{- with .ipFamilyPolicy }}
ipFamilyPolicy: {{ . }}
{{- end }}
{{- with .ipFamilies }}
ipFamilies:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
