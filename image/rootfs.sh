#!/usr/bin/env bash
# Lays out groundskeeper's distroless-style root filesystem in DIR: Debian's base files, glibc,
# libgcc, the CA bundle and netbase from Debian 12's own packages (apt-get download + dpkg-deb
# -x, no package scripts run), a passwd with root and nonroot (65532). No shell, no package
# manager.
# Both `make image` and the Dockerfile use it, so both images hold the same files.
# What dpkg would have recorded is there for scanners (syft, Trivy, Grype) and `dpkg-query
# --admindir`: each package's record in /var/lib/dpkg/status, its files and their md5sums in
# /var/lib/dpkg/info, its license in /usr/share/doc/<package>/copyright.
# Usage: rootfs.sh DIR [DEB_CACHE]
set -euo pipefail
dir=$1
debs=${2:-$(mktemp -d)}
# base-files: the directory tree, /etc/os-release (which tells scanners the distribution and
# release whose advisories apply to the packages) and /usr/share/common-licenses (which the
# packages' copyright files refer to), as in distroless. gcc-12-base, which libgcc-s1 depends
# on, holds only libgcc's copyright (libgcc-s1's /usr/share/doc entry is a link to it).
packages=(base-files libc6 libgcc-s1 gcc-12-base ca-certificates netbase)
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
# The newest of each package in the cache, should it hold several.
newest() { printf '%s\n' "$debs/${1}_"*.deb | sort -V | tail -n 1; }
for p in "${packages[@]}"; do
  dpkg-deb -x "$(newest "$p")" "$dir"
done
# What ca-certificates' maintainer script would generate: the bundle rustls and openssl read.
mkdir -p "$dir/etc/ssl/certs"
find "$dir/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat > "$dir/etc/ssl/certs/ca-certificates.crt"
# Documentation and manual pages serve no one inside an image; each package's copyright stays
# (license scanners read /usr/share/doc/<package>/copyright, as Debian policy puts it there).
find "$dir/usr/share/doc" -mindepth 2 ! -path "$dir/usr/share/doc/*/copyright" -prune -exec rm -rf {} +
rm -rf "$dir/usr/share/man" "$dir/usr/share/lintian" "$dir/usr/share/locale"
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

# The dpkg database, as `dpkg --install` leaves it, of what is in DIR now: the status record of
# each package (its control file with `Status: install ok installed` and, as dpkg adds, its
# conffiles' md5sums), sorted by name; info/<package>.list with the package's paths that are
# still there (the documentation above is not), info/<package>.md5sums likewise. A Multi-Arch:
# same package's info files are named <package>:<arch>, as dpkg names them (info/format 1 says
# so to dpkg-query).
admin=$dir/var/lib/dpkg
mkdir -p "$admin/info" "$admin/updates"
echo 1 > "$admin/info/format"
: > "$admin/status"
mapfile -t sorted < <(printf '%s\n' "${packages[@]}" | LC_ALL=C sort)
for p in "${sorted[@]}"; do
  deb=$(newest "$p")
  ctrl=$(mktemp -d)
  dpkg-deb --control "$deb" "$ctrl"
  name=$p
  [ "$(dpkg-deb -f "$deb" Multi-Arch)" != same ] || name=$p:$(dpkg-deb -f "$deb" Architecture)
  {
    sed '/^Package:/a Status: install ok installed' "$ctrl/control"
    if [ -s "$ctrl/conffiles" ]; then
      echo "Conffiles:"
      while read -r f; do
        [ ! -e "$dir$f" ] || echo " $f $(md5sum < "$dir$f" | cut -d" " -f1)"
      done < "$ctrl/conffiles"
    fi
    echo
  } >> "$admin/status"
  dpkg-deb --fsys-tarfile "$deb" | tar -t | while read -r f; do
    f=${f#.}; f=${f%/}
    if [ -z "$f" ]; then echo /.; elif [ -e "$dir$f" ] || [ -L "$dir$f" ]; then echo "$f"; fi
  done > "$admin/info/$name.list"
  if [ -f "$ctrl/md5sums" ]; then
    while read -r sum f; do
      [ ! -e "$dir/$f" ] || echo "$sum  $f"
    done < "$ctrl/md5sums" > "$admin/info/$name.md5sums"
  fi
  rm -rf "$ctrl"
done
