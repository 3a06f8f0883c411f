#!/usr/bin/env bash
# Checks that image/sbom_check.sh can fail: three copies of the image ARCHIVE, each lacking one
# thing scanners read, repacked with image/oci.py, must each fail with the line naming it:
# - no dpkg database (/var/lib/dpkg) nor os-release: dpkg-query finds no libc6, nor does syft,
#   which finds no distribution either;
# - node-agent without its `.dep-v0` section (objcopy): rust-audit-info reads no crate list,
#   syft no kube in it;
# - no labels in the config.
# Usage: sbom_check_test.sh ARCHIVE
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
archive=$1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/oci" "$scratch/rootfs"
tar -xf "$archive" -C "$scratch/oci"
# The layer, the labels as oci.py arguments, and the time the image was packed with.
mapfile -t meta < <(python3 - "$scratch/oci" <<'PY'
import calendar, json, sys, time
d = sys.argv[1]
blob = lambda digest: f"{d}/blobs/sha256/{digest.split(':')[1]}"
manifest = json.load(open(blob(json.load(open(f"{d}/index.json"))["manifests"][0]["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))
print(blob(manifest["layers"][0]["digest"]))
created = config.get("created")
print(calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ")) if created else 0)
for k, v in sorted((config["config"].get("Labels") or {}).items()):
    print("--label")
    print(f"{k}={v}")
PY
)
tar -xzf "${meta[0]}" -C "$scratch/rootfs"
epoch=${meta[1]}
labels=("${meta[@]:2}")

# bad NAME EXPECTED... [-- oci.py arguments]: packs the rootfs as it is now; the check must fail
# with every EXPECTED line among its output.
bad() {
  local name=$1 out=$scratch/$1.oci.tar log=$scratch/$1.log want
  shift
  local expected=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do expected+=("$1"); shift; done
  [ $# -eq 0 ] || shift
  SOURCE_DATE_EPOCH=$epoch python3 "$root/image/oci.py" "$scratch/rootfs" "$out" "bad/$name:test" \
    --entrypoint /usr/local/bin/controller-manager --user 65532:65532 "$@" >/dev/null 2>&1
  if bash "$root/image/sbom_check.sh" "$out" >"$log" 2>&1; then
    cat "$log"; echo "FAIL: sbom_check passed an image with $name"; exit 1
  fi
  for want in "${expected[@]}"; do
    grep -F -- "$want" "$log" >/dev/null || { cat "$log"; echo "FAIL: sbom_check on an image with $name did not say: $want"; exit 1; }
  done
  echo "sbom_check_test: an image with $name fails: $(grep -c '^FAIL' "$log") misses named"
}

mv "$scratch/rootfs/var/lib/dpkg" "$scratch/dpkg"
mv "$scratch/rootfs/usr/lib/os-release" "$scratch/os-release"
bad "no dpkg database nor os-release" "FAIL: dpkg-query --admindir=/var/lib/dpkg: libc6 is not installed" \
  "FAIL: syft scan: no deb libc6" "FAIL: syft scan: no distro debian 12" -- "${labels[@]}"
mv "$scratch/dpkg" "$scratch/rootfs/var/lib/dpkg"
mv "$scratch/os-release" "$scratch/rootfs/usr/lib/os-release"

cp "$scratch/rootfs/usr/local/bin/node-agent" "$scratch/node-agent"
objcopy --remove-section .dep-v0 "$scratch/node-agent" "$scratch/rootfs/usr/local/bin/node-agent"
bad "a binary without its crate list" "FAIL: rust-audit-info /usr/local/bin/node-agent:" \
  "FAIL: syft scan: no rust-crate kube /usr/local/bin/node-agent" -- "${labels[@]}"
cp "$scratch/node-agent" "$scratch/rootfs/usr/local/bin/node-agent"

bad "no labels" "FAIL: label org.opencontainers.image.source=None" \
  "FAIL: label org.opencontainers.image.revision=None" "FAIL: no label org.opencontainers.image.title"
