#!/usr/bin/env bash
# The images the real node runs besides groundskeeper's own, built here (no registry is
# reachable): `pause`, the sandbox image, from Debian's static catatonit run as `catatonit -P`;
# `tools`, Debian's static busybox (sh, nc, wget) for the UDP server and client of the conntrack
# tests and for `helm test`. Usage: images.sh pause|tools|all OUT_DIR
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
  mkdir -p "$work/tools/bin" "$work/tools/tmp" "$work/tools/etc"
  install -m 0755 "$busybox" "$work/tools/bin/busybox"
  for applet in sh nc wget sleep echo cat date hostname ls grep sed seq timeout; do
    ln -s busybox "$work/tools/bin/$applet"
  done
  chmod 1777 "$work/tools/tmp"
  printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65532:65532:nobody:/:/bin/sh\n' > "$work/tools/etc/passwd"
  python3 "$here/../image/oci.py" "$work/tools" "$out/tools.tar" gk.local/tools:1 \
    --cmd /bin/sh --env PATH=/bin
fi
