#!/usr/bin/env bash
# Lays out groundskeeper's distroless-style root filesystem in DIR: glibc, libgcc, the CA
# bundle and netbase from Debian 12's own packages (apt-get download + dpkg-deb -x, no package
# scripts run), a passwd with root and nonroot (65532), and /tmp. No shell, no package manager.
# Both `make image` and the Dockerfile use it, so both images hold the same files.
# Usage: rootfs.sh DIR [DEB_CACHE]
set -euo pipefail
dir=$1
debs=${2:-$(mktemp -d)}
packages=(libc6 libgcc-s1 ca-certificates netbase)
mkdir -p "$debs"
missing=()
for p in "${packages[@]}"; do
  compgen -G "$debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  # apt-get download needs a package list; an old or empty one finds nothing.
  (cd "$debs" && { apt-get download -qq "${missing[@]}" 2>/dev/null \
    || { apt-get update -qq && apt-get download -qq "${missing[@]}"; }; })
fi
rm -rf "$dir"
mkdir -p "$dir"
for p in "${packages[@]}"; do
  # The newest of each package in the cache, should it hold several.
  deb=$(ls "$debs/${p}_"*.deb | sort -V | tail -n 1)
  dpkg-deb -x "$deb" "$dir"
done
# What ca-certificates' maintainer script would generate: the bundle rustls and openssl read.
mkdir -p "$dir/etc/ssl/certs"
find "$dir/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat > "$dir/etc/ssl/certs/ca-certificates.crt"
# Documentation and manual pages serve no one inside an image.
rm -rf "$dir/usr/share/doc" "$dir/usr/share/man" "$dir/usr/share/lintian" "$dir/usr/share/locale"
cat > "$dir/etc/passwd" <<'P'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
P
cat > "$dir/etc/group" <<'G'
root:x:0:
nonroot:x:65532:
G
mkdir -p "$dir/tmp" "$dir/home/nonroot" "$dir/root"
chmod 1777 "$dir/tmp"
chmod 0700 "$dir/root"
chown 65532:65532 "$dir/home/nonroot" 2>/dev/null || true
