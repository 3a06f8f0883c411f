#!/usr/bin/env bash
# The images the real node runs besides groundskeeper's own, built here (no registry is
# reachable): `pause`, the sandbox image, from Debian's static catatonit run as `catatonit -P`;
# `tools`, Debian's static busybox (sh, wget) for `helm test`, testkit's udp-probe, the UDP
# server and client of the conntrack tests (Debian's busybox has no UDP netcat), and testkit's
# slow-clients, the hostile pod of the slow-client test.
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
  # ldd exits 1 on a static binary (pipefail would count it), and `file` may not be installed:
  # read ldd's words.
  grep -q 'not a dynamic' <<<"$(ldd "$busybox" 2>&1)" \
    || { echo "images.sh: $busybox is not static (apt-get install busybox-static)" >&2; exit 1; }
  root=$(cd "$here/.." && pwd)
  bins=${CARGO_TARGET_DIR:-$root/target}/debug
  (cd "$root" && cargo build -q -p testkit --bin udp-probe --bin slow-clients)
  mkdir -p "$work/tools/bin" "$work/tools/tmp" "$work/tools/etc" "$work/tools/opt/probe/lib"
  chmod 1777 "$work/tools/tmp"
  printf 'root:x:0:0:root:/:/bin/sh\nnonroot:x:65532:65532:nonroot:/:/bin/sh\n' > "$work/tools/etc/passwd"
  install -m 0755 "$busybox" "$work/tools/bin/busybox"
  for applet in sh wget sleep echo cat date hostname ls grep sed seq timeout nslookup true; do
    ln -s busybox "$work/tools/bin/$applet"
  done
  # udp-probe and slow-clients (the hostile pod of the slow-client test) are dynamically
  # linked; their glibc stays out of the default library paths, where static busybox's resolver
  # would dlopen it and crash (a static glibc cannot load a shared one), and is named by the
  # wrappers instead.
  for bin in udp-probe slow-clients; do
    install -m 0755 "$bins/$bin" "$work/tools/opt/probe/$bin"
    for lib in $(ldd "$bins/$bin" | grep -o '/[^ ]*'); do cp -L "$lib" "$work/tools/opt/probe/lib/"; done
    printf '#!/bin/sh\nexec /opt/probe/lib/ld-linux-x86-64.so.2 --library-path /opt/probe/lib /opt/probe/%s "$@"\n' "$bin" \
      > "$work/tools/bin/$bin"
    chmod 0755 "$work/tools/bin/$bin"
  done
  python3 "$here/../image/oci.py" "$work/tools" "$out/tools.tar" gk.local/tools:1 \
    --cmd /bin/sh --env PATH=/bin
fi
