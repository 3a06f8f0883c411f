#!/usr/bin/env bash
# The chart as one file for `kubectl apply -f` (a release asset, `make manifest`): its default
# values, release `groundskeeper` in namespace `groundskeeper`, the Namespace and the CRD
# included. No helm hooks: kubectl would run the post-delete Job at once, beside a running
# leader, and create the helm test Pod as a workload. docs/installing.md says what that leaves out.
#
# Usage: manifest.sh render HELM OUT      writes OUT
#        manifest.sh check KUBECTL FILE   fails unless FILE parses as YAML (kubectl kustomize,
#                                         no cluster) and holds the Namespace, the CRD and both
#                                         workloads, and no helm hook
set -euo pipefail
name=groundskeeper
chart=$(cd "$(dirname "$0")" && pwd)/groundskeeper

render() {
  local helm=$1 out=$2
  local version
  # The release's tag (the release workflow holds the tag to appVersion).
  version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart/Chart.yaml")
  mkdir -p "$(dirname "$out")"
  {
    echo "# groundskeeper $version for \`kubectl apply --server-side -f\`: the Helm chart with its default values"
    echo "# (make manifest). What it installs, what it does not do that helm does, and how to remove it:"
    echo "# https://github.com/groundskeeper-dev/groundskeeper/blob/v$version/docs/installing.md"
    "$helm" template "$name" "$chart" -n "$name" --include-crds --no-hooks --set namespace.create=true
  } > "$out.tmp"
  mv "$out.tmp" "$out"
  echo "manifest: $out"
}

check() {
  local kubectl=$1 file=$2 dir
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  cp "$file" "$dir/manifest.yaml"
  printf 'resources: [manifest.yaml]\n' > "$dir/kustomization.yaml"
  # kustomize parses every document and writes each object back in one layout: top-level keys
  # at column 0, metadata's own two spaces in.
  "$kubectl" kustomize "$dir" > "$dir/parsed.yaml" 2> "$dir/err" \
    || { echo "FAIL: $file does not parse: $(cat "$dir/err")"; return 1; }
  awk '/^---/{k="";m=0} /^kind: /{k=$2} /^[a-zA-Z]/{m=($0 ~ /^metadata:/)} m&&/^  name: /{print k, $2; m=0}' \
    "$dir/parsed.yaml" > "$dir/objects"
  local want
  for want in "Namespace $name" "CustomResourceDefinition sysctlpolicies.groundskeeper.dev" \
    "Deployment $name-controller-manager" "DaemonSet $name-node-agent"; do
    grep -qx "$want" "$dir/objects" || { echo "FAIL: $file has no $want"; return 1; }
  done
  if grep -n "helm.sh/hook" "$file" > "$dir/hooks"; then
    echo "FAIL: $file holds helm hooks, which kubectl apply would create as plain objects: $(head -3 "$dir/hooks" | tr '\n' ' ')"
    return 1
  fi
  echo "manifest: $file parses, has the Namespace, the CRD and both workloads, and no helm hook ($(wc -l < "$dir/objects") objects)"
}

case ${1:-} in
  render) render "$2" "$3" ;;
  check) check "$2" "$3" ;;
  *) echo "usage: $0 render HELM OUT | check KUBECTL FILE" >&2; exit 2 ;;
esac
