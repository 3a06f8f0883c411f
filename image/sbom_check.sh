#!/usr/bin/env bash
# Reads back what `make image` declares about its contents, with the tools scanners and people
# use, and fails, naming each miss, unless all of it is there:
# - packages: `dpkg-query --admindir` lists every package image/rootfs.sh installs as `install ok
#   installed`; `dpkg --verify` finds every file as its package's md5sums say; each package has
#   its /usr/share/doc/<package>/copyright;
# - crates: rust-audit-info reads each binary's `.dep-v0` section (cargo auditable) and finds kube
#   and tokio among its crates;
# - syft, scanning the archive as the release workflow does for the SBOM it attaches, finds the
#   distribution and release (/etc/os-release: what Grype and Trivy match the packages' advisories
#   by), each of those packages (at dpkg-query's version), and kube and tokio in each binary;
# - labels: the config's org.opencontainers.image.* labels, each with what image/build.sh derives
#   (Chart.yaml's home and appVersion, Cargo.toml's license, the commit and its time).
# The readers come pinned from .ci/cargo-install.sh (rust-audit-info) and .ci/syft.sh.
# Usage: sbom_check.sh ARCHIVE   (default: target/image/groundskeeper.oci.tar)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
archive=${1:-${CARGO_TARGET_DIR:-$root/target}/image/groundskeeper.oci.tar}
[ -f "$archive" ] || { echo "FAIL: no image at $archive (make image builds it)"; exit 1; }
bash "$root/.ci/cargo-install.sh" rust-audit-info
bash "$root/.ci/syft.sh" >/dev/null
tools=$root/.tools/bin
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# The archive's one manifest, its config and its layer, unpacked.
mkdir -p "$scratch/oci" "$scratch/rootfs"
tar -xf "$archive" -C "$scratch/oci"
read -r config layer < <(python3 - "$scratch/oci" <<'PY'
import json, sys
d = sys.argv[1]
blob = lambda digest: f"{d}/blobs/sha256/{digest.split(':')[1]}"
index = json.load(open(f"{d}/index.json"))
manifest = json.load(open(blob(index["manifests"][0]["digest"])))
print(blob(manifest["config"]["digest"]), blob(manifest["layers"][0]["digest"]))
PY
)
tar -xzf "$layer" -C "$scratch/rootfs"
rootfs=$scratch/rootfs

# Packages: what rootfs.sh installs, as dpkg itself reads the image's database.
read -ra packages <<<"$(sed -n 's/^packages=(\(.*\))$/\1/p' "$root/image/rootfs.sh")"
[ ${#packages[@]} -gt 0 ] || { echo "FAIL: no packages=(...) line in image/rootfs.sh"; exit 1; }
admin=$rootfs/var/lib/dpkg
installed=$(dpkg-query --admindir="$admin" -W -f '${Package} ${Version} ${Status}\n' 2>&1) || installed=
declare -A version=()
for p in "${packages[@]}"; do
  line=$(awk -v p="$p" '$1 == p' <<<"$installed")
  if [ "${line#* * }" != "install ok installed" ]; then
    fail "dpkg-query --admindir=/var/lib/dpkg: $p is not installed (${line:-absent})"
    continue
  fi
  version[$p]=$(cut -d' ' -f2 <<<"$line")
  [ -r "$rootfs/usr/share/doc/$p/copyright" ] || fail "$p: no /usr/share/doc/$p/copyright"
  files=$(dpkg-query --admindir="$admin" -L "$p" 2>/dev/null | grep -cv '^/\.$' || true)
  [ "$files" -gt 1 ] || fail "dpkg-query -L $p: no file list (/var/lib/dpkg/info)"
done
if [ -f "$admin/status" ]; then
  verify=$(dpkg --root="$rootfs" --verify 2>&1 || true)
  [ -z "$verify" ] || fail "dpkg --verify: files differ from their packages' md5sums: $verify"
fi
echo "sbom_check: dpkg-query: ${#version[@]} of ${#packages[@]} packages installed ($(for p in "${!version[@]}"; do echo "$p ${version[$p]}"; done | sort | paste -sd, | sed 's/,/, /g'))"

# Crates: each binary's `.dep-v0`, as rust-audit-info (cargo-auditable's reader) decodes it.
bins=()
for b in "$rootfs"/usr/local/bin/*; do
  bins+=("${b##*/}")
  if ! deps=$("$tools/rust-audit-info" "$b" 2>&1); then
    fail "rust-audit-info /usr/local/bin/${b##*/}: ${deps%%$'\n'*}"
    continue
  fi
  # The root (the binary's own package) first, then every crate.
  found=$(python3 -c 'import json, sys; ps = json.load(sys.stdin)["packages"]; print(" ".join([p["name"] for p in ps if p.get("root")][:1] + sorted(p["name"] for p in ps)))' <<<"$deps")
  for crate in kube tokio; do
    [[ " ${found#* } " == *" $crate "* ]] || fail "rust-audit-info /usr/local/bin/${b##*/}: no $crate among its crates"
  done
  [[ $found == groundskeeper-* ]] || fail "rust-audit-info /usr/local/bin/${b##*/}: its root crate is ${found%% *}, not one of groundskeeper's"
  echo "sbom_check: rust-audit-info /usr/local/bin/${b##*/}: $(($(wc -w <<<"$found") - 1)) crates, its own ${found%% *} among them"
done
[ ${#bins[@]} -gt 0 ] || fail "no binary in /usr/local/bin"

# syft on the archive itself, as the release workflow makes the SBOM it attaches.
if SYFT_CHECK_FOR_APP_UPDATE=false "$tools/syft" scan "oci-archive:$archive" -q -o "syft-json=$scratch/syft.json" 2>"$scratch/syft.err"; then
  # The release whose advisories apply, as the image's os-release (base-files') says it.
  release=$(sed -n 's/^VERSION_ID="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$rootfs/usr/lib/os-release" 2>/dev/null || true)
  { echo "distro debian ${release:-12}"
    for p in "${packages[@]}"; do echo "deb $p${version[$p]:+ ${version[$p]}}"; done
    for b in "${bins[@]}"; do echo "rust-crate kube /usr/local/bin/$b"; echo "rust-crate tokio /usr/local/bin/$b"; done
  } > "$scratch/want"
  missing=$(python3 - "$scratch/syft.json" "$scratch/want" <<'PY'
import json, sys
sbom = json.load(open(sys.argv[1]))
distro = sbom.get("distro") or {}
have = {f"distro {distro.get('id')} {distro.get('versionID')}"}
for a in sbom["artifacts"]:
    have.add(f"{a['type']} {a['name']}")
    have.add(f"{a['type']} {a['name']} {a['version']}")
    for loc in a["locations"]:
        have.add(f"{a['type']} {a['name']} {loc['path']}")
for line in open(sys.argv[2]).read().splitlines():
    if line not in have:
        print(line)
PY
  )
  while read -r m; do [ -z "$m" ] || fail "syft scan: no $m"; done <<<"$missing"
  echo "sbom_check: syft scan: $(python3 -c 'import json, sys, collections; d = json.load(open(sys.argv[1])); print(d.get("distro", {}).get("prettyName", "no distro") + ": " + ", ".join(f"{n} {t}" for t, n in sorted(collections.Counter(a["type"] for a in d["artifacts"]).items())))' "$scratch/syft.json")"
else
  fail "syft scan oci-archive:$archive: $(tail -n 3 "$scratch/syft.err")"
fi

# Labels, each with the value image/build.sh derives.
chart=$root/charts/groundskeeper/Chart.yaml
revision=${GROUNDSKEEPER_REVISION:-$(git -C "$root" rev-parse HEAD 2>/dev/null || true)}
labels=$(python3 - "$config" \
  "org.opencontainers.image.source=$(sed -n 's/^home: *//p' "$chart")" \
  "org.opencontainers.image.version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart")" \
  "org.opencontainers.image.licenses=$(sed -n 's/^license *= *"\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)" \
  "org.opencontainers.image.revision=$revision" <<'PY'
import json, re, sys
config = json.load(open(sys.argv[1]))
labels = config.get("config", {}).get("Labels") or {}
for want in sys.argv[2:]:
    key, value = want.split("=", 1)
    if key.endswith(".revision") and not value:
        # No commit to compare with here (no git): a commit, at least.
        if not re.fullmatch(r"[0-9a-f]{40}", labels.get(key) or ""):
            print(f"FAIL: label {key}={labels.get(key)!r}, expected a commit")
    elif labels.get(key) != value:
        print(f"FAIL: label {key}={labels.get(key)!r}, expected {value!r}")
for key in ("org.opencontainers.image.title", "org.opencontainers.image.description"):
    if not labels.get(key):
        print(f"FAIL: no label {key}")
created = labels.get("org.opencontainers.image.created")
if created != config.get("created") or (created and not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created)):
    print(f"FAIL: label org.opencontainers.image.created={created!r}, the config's created {config.get('created')!r}")
print(f"sbom_check: labels: {len([k for k in labels if k.startswith('org.opencontainers.image.')])} org.opencontainers.image.* ({labels.get('org.opencontainers.image.revision', '')[:12]}, created {created})")
PY
)
while read -r l; do
  case $l in FAIL:*) fail "${l#FAIL: }" ;; *) echo "$l" ;; esac
done <<<"$labels"

if [ "$fails" -gt 0 ]; then
  echo "sbom_check: $fails failed"
  exit 1
fi
echo "sbom_check: the packages, each binary's crates and the labels are where scanners read them"
