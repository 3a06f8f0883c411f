# shellcheck shell=bash disable=SC2154 # shared, bin and die are the sourcing script's
# The Kubernetes binaries of the end-to-end cluster, unpacked and checked into `bin` once:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy, v1.36.2.
# Sourced by e2e/cluster.sh (bash; e2e/lib.sh does not source it, so it need not parse under
# sh) and by hack/binaries_test.sh; it uses their `die`, `shared` (SHARED_BIN) and `bin`.
#
# Where they come from, the first that applies:
# 1. E2E_KUBERNETES_TARBALLS: upstream's release tarballs as published at dl.k8s.io, separated
#    by spaces (a folder stands for upstream's tarballs in it): kubernetes-server-linux-amd64.tar.gz
#    holds all five; kubernetes-node-linux-amd64.tar.gz only kubelet and kube-proxy, so it comes
#    with the server tarball or not at all;
# 2. shared/'s repacked kubernetes-node-v1.36.2-linux-amd64.tar.xz (the four binaries besides
#    kube-apiserver, at its top) and shared/'s kube-apiserver;
# 3. upstream's tarballs in shared/, under the names upstream gives them.
# Upstream's are told apart by their layout (kubernetes/server/bin/, kubernetes/node/bin/), each
# checked against the .sha256 file upstream publishes beside it (it must be beside it here too);
# shared/'s against the checksum files beside them, and its binaries against shared/bin/README.md's
# list. Whatever the source, each binary must print `Kubernetes v1.36.2` for --version.

KUBE_VERSION=v1.36.2
KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
KUBE_DOWNLOADS=https://dl.k8s.io/$KUBE_VERSION
KUBE_REPACKED=kubernetes-node-$KUBE_VERSION-linux-amd64.tar.xz
KUBE_UPSTREAM=(kubernetes-server-linux-amd64.tar.gz kubernetes-node-linux-amd64.tar.gz)

# Sets kube_tarballs (absolute paths) and kube_repacked (1 for shared/'s repacked tarball), or
# dies saying what to provide.
kube_source() {
  kube_repacked='' kube_tarballs=()
  local entry name
  if [ -n "${E2E_KUBERNETES_TARBALLS:-}" ]; then
    local entries
    read -r -a entries <<<"$E2E_KUBERNETES_TARBALLS"
    for entry in "${entries[@]}"; do
      if [ -d "$entry" ]; then
        local before=${#kube_tarballs[@]}
        for name in "${KUBE_UPSTREAM[@]}"; do
          if [ -f "$entry/$name" ]; then kube_tarballs+=("$(cd "$entry" && pwd)/$name"); fi
        done
        [ "${#kube_tarballs[@]}" -gt "$before" ] \
          || die "E2E_KUBERNETES_TARBALLS names the folder $entry, which holds neither ${KUBE_UPSTREAM[*]}"
      elif [ -f "$entry" ]; then
        kube_tarballs+=("$(cd "$(dirname "$entry")" && pwd)/$(basename "$entry")")
      else
        die "E2E_KUBERNETES_TARBALLS names $entry: no such file or folder"
      fi
    done
    return
  fi
  if [ -f "$shared/$KUBE_REPACKED" ]; then
    kube_repacked=1 kube_tarballs=("$(cd "$shared" && pwd)/$KUBE_REPACKED")
    return
  fi
  for name in "${KUBE_UPSTREAM[@]}"; do
    if [ -f "$shared/$name" ]; then kube_tarballs+=("$(cd "$shared" && pwd)/$name"); fi
  done
  [ ${#kube_tarballs[@]} -gt 0 ] || die "no Kubernetes $KUBE_VERSION binaries: download upstream's \
$KUBE_DOWNLOADS/${KUBE_UPSTREAM[0]} and its .sha256 into $shared or name the tarball in \
E2E_KUBERNETES_TARBALLS (or give $shared the repacked $KUBE_REPACKED and kube-apiserver); see docs/testing.md"
}

# unpack_upstream DEST TARBALL...: the five binaries from upstream's release tarballs into DEST,
# each from the first tarball holding it. Each tarball must match the .sha256 beside it, and
# have upstream's server or node layout with every binary of that layout; together they must
# hold all five. Dies naming the tarball and what it lacks otherwise.
unpack_upstream() {
  local dest=$1 t want sum listed dir layout b
  shift
  mkdir -p "$dest"
  for t in "$@"; do
    [ -f "$t" ] || die "$t: no such file"
    [ -f "$t.sha256" ] || die "$t.sha256 is missing: upstream publishes it beside the tarball \
($KUBE_DOWNLOADS/$(basename "$t").sha256); put it beside $t"
    want=$(awk '{print $1; exit}' "$t.sha256")
    sum=$(sha256sum "$t")
    sum=${sum%% *}
    [ "$sum" = "$want" ] || die "$t does not match $t.sha256 (its sha256 is $sum)"
    listed=$(tar -tf "$t") || die "$t: tar can not read it"
    local wanted=()
    if grep -q '^kubernetes/server/bin/' <<<"$listed"; then
      layout=server dir=kubernetes/server/bin wanted=("${KUBE_BINARIES[@]}")
    elif grep -q '^kubernetes/node/bin/' <<<"$listed"; then
      layout=node dir=kubernetes/node/bin wanted=(kubelet kube-proxy)
    else
      die "$t has neither of upstream's layouts: kubernetes/server/bin/ (${KUBE_UPSTREAM[0]}) nor kubernetes/node/bin/ (${KUBE_UPSTREAM[1]})"
    fi
    local lacking=() members=()
    for b in "${wanted[@]}"; do
      grep -qx "$dir/$b" <<<"$listed" || lacking+=("$b")
      [ -e "$dest/$b" ] || members+=("$dir/$b")
    done
    [ ${#lacking[@]} -eq 0 ] || die "$t has upstream's $layout layout ($dir/) but no ${lacking[*]}"
    [ ${#members[@]} -eq 0 ] || tar -xf "$t" -C "$dest" --strip-components=3 "${members[@]}" \
      || die "$t: unpacking ${members[*]} failed"
  done
  local missing=()
  for b in "${KUBE_BINARIES[@]}"; do
    [ -e "$dest/$b" ] || missing+=("$b")
  done
  [ ${#missing[@]} -eq 0 ] || die "no ${missing[*]} in $*: upstream's node tarball holds only \
kubelet and kube-proxy; its server tarball holds all five ($KUBE_DOWNLOADS/${KUBE_UPSTREAM[0]})"
}

# kube_versions DIR: each binary in DIR prints `Kubernetes v1.36.2` for --version.
kube_versions() {
  local b v
  for b in "${KUBE_BINARIES[@]}"; do
    v=$("$1/$b" --version 2>&1) || die "$b --version failed: $v"
    [ "$v" = "Kubernetes $KUBE_VERSION" ] || die "$b prints \"$v\" for --version, not \"Kubernetes $KUBE_VERSION\""
  done
}

# Unpacks and checks the binaries into $bin, unless $bin/.verified names the same files (path,
# size, time) as they come from now. They are unpacked beside it first: a check that fails
# leaves no half of a set in $bin.
kube_binaries() {
  kube_source
  local from=("${kube_tarballs[@]}") key new=$bin.new
  [ -z "$kube_repacked" ] || from+=("$(cd "$shared" && pwd)/kube-apiserver")
  key=$(stat -L -c '%n %s %Y' "${from[@]}") || die "$shared/kube-apiserver is missing beside $KUBE_REPACKED"
  if [ -f "$bin/.verified" ] && [ "$(cat "$bin/.verified")" = "$key" ]; then
    return
  fi
  rm -rf "$new" && mkdir -p "$new"
  if [ -n "$kube_repacked" ]; then
    (cd "$shared" && sha256sum --check --quiet "$KUBE_REPACKED.sha256" kube-apiserver.sha256) \
      || die "shared/bin checksums do not match"
    tar -xJf "${kube_tarballs[0]}" -C "$new"
    (cd "$new" && sha256sum --check --quiet) <<'SUMS' || die "a node binary does not match shared/bin/README.md's checksum"
63ac78d21fd83be5f15ae385e3fa3c9d378b3eabe1610da906c9d9ab3bd7ab31  kube-controller-manager
7a5f6e679a7f4404e6620fd3d9e6df516b6ff72fcff9011dc8ed000f2942c7a8  kube-scheduler
5f89a97112a9b769433cf374117bbbe1d07eb3a13a349604435cf7ad28457882  kubelet
a51e15f78e4fa51a44ff79b94c72debb62d597b6fe1c539ffee42f108fe37759  kube-proxy
SUMS
    ln -sf "$(cd "$shared" && pwd)/kube-apiserver" "$new/kube-apiserver"
  else
    unpack_upstream "$new" "${kube_tarballs[@]}"
  fi
  kube_versions "$new"
  rm -rf "$bin" && mv "$new" "$bin"
  echo "$key" >"$bin/.verified"
}

# The Kubernetes binaries, then what else a node and the control plane run, from Debian.
binaries() {
  kube_binaries
  local missing=() c
  for c in containerd ctr runc iptables ip6tables nft conntrack openssl catatonit setpriv unshare nsenter; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  [ -x /usr/bin/etcd ] || missing+=(etcd)
  [ -x /usr/lib/cni/ptp ] || missing+=(/usr/lib/cni/ptp)
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: apt-get install containerd runc iptables nftables conntrack openssl catatonit util-linux etcd-server containernetworking-plugins (bash .ci/run does)"
}
