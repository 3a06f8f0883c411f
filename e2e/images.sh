#!/usr/bin/env bash
# The images the real node runs besides groundskeeper's own, built here (no registry is
# reachable): `pause`, the sandbox image, from Debian's static catatonit run as `catatonit -P`;
# `tools`, groundskeeper's root filesystem with Debian's static busybox (sh, wget) for `helm
# test` and testkit's udp-probe, the UDP server and client of the conntrack tests.
# Usage: images.sh pause|tools|all OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
what=$1
out=$2
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "$what" = pause ] || [ "$what" = all ]; then
  [ -x /usr/bin/catatonit ] || { echo "images.sh: no /usr/bin/catatonit (apt-get install catatonit)" >&2; exit 1; }
  install -D -m 0755 /usr/bin/catatonit "$work/pause/catatonit"
  python3 "$here/../image/oci.py" "$work/pause" "$out/pause.tar" gk.local/pause:1 \
    --entrypoint=/catatonit --entrypoint=-P --user 65535:65535
fi
if [ "$what" = tools ] || [ "$what" = all ]; then
  busybox=$(command -v busybox) || { echo "images.sh: no busybox (apt-get install busybox-static)" >&2; exit 1; }
  file -L "$busybox" 2>/dev/null | grep -q 'statically linked' || ldd "$busybox" 2>&1 | grep -q 'not a dynamic' \
    || { echo "images.sh: $busybox is not static (apt-get install busybox-static)" >&2; exit 1; }
  root=$(cd "$here/.." && pwd)
  probe=${CARGO_TARGET_DIR:-$root/target}/debug/udp-probe
  (cd "$root" && cargo build -q -p testkit --bin udp-probe)
  bash "$root/image/rootfs.sh" "$work/tools" "${CARGO_TARGET_DIR:-$root/target}/image/debs"
  mkdir -p "$work/tools/bin"
  install -m 0755 "$busybox" "$work/tools/bin/busybox"
  install -m 0755 "$probe" "$work/tools/bin/udp-probe"
  for applet in sh wget sleep echo cat date hostname ls grep sed seq timeout nslookup; do
    ln -s busybox "$work/tools/bin/$applet"
  done
  python3 "$here/../image/oci.py" "$work/tools" "$out/tools.tar" gk.local/tools:1 \
    --cmd /bin/sh --env PATH=/bin:/usr/bin
fi
