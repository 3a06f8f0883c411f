#!/usr/bin/env bash
# Checks e2e/binaries.sh, where the end-to-end cluster's Kubernetes binaries come from, on made-up
# tarballs of upstream's layouts (shell scripts named kubelet etc. that print a version); no
# network, no cluster, no root:
# - upstream's server tarball alone gives all five binaries, and with its node tarball too;
# - a node tarball alone, a tarball lacking one binary of its layout, one of neither layout, one
#   that does not match its .sha256 or has none, and a binary of another version are refused,
#   each in a line naming what is wrong;
# - the source: E2E_KUBERNETES_TARBALLS (files or a folder), else upstream's tarballs in
#   SHARED_BIN; nothing there is refused in a line saying what to download; a second unpack of
#   the same tarballs is skipped, a refused one leaves the binaries unpacked before in place,
#   other tarballs are unpacked again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
die() { echo "cluster.sh: $*" >&2; exit 1; }
# shellcheck source=e2e/binaries.sh
. "$root/e2e/binaries.sh"

# tarball NAME LAYOUT VERSION BINARY...: upstream's layout (kubernetes/LAYOUT/bin/), with extras
# upstream ships beside the binaries, and its .sha256 as upstream publishes it (the hash alone).
tarball() {
  local name=$1 layout=$2 version=$3 b
  shift 3
  local src=$scratch/src-$name
  rm -rf "$src" && mkdir -p "$src/kubernetes/$layout/bin"
  for b in "$@"; do
    printf '#!/bin/sh\necho "Kubernetes %s"\n' "$version" >"$src/kubernetes/$layout/bin/$b"
    chmod +x "$src/kubernetes/$layout/bin/$b"
  done
  echo image >"$src/kubernetes/$layout/bin/kube-apiserver.tar"
  echo license >"$src/kubernetes/LICENSES"
  mkdir -p "$scratch/dl"
  tar -czf "$scratch/dl/$name" -C "$src" kubernetes
  sha256sum "$scratch/dl/$name" | awk '{print $1}' >"$scratch/dl/$name.sha256"
}
server=kubernetes-server-linux-amd64.tar.gz
node=kubernetes-node-linux-amd64.tar.gz
tarball "$server" server v1.36.2 kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kubeadm
tarball "$node" node v1.36.2 kubelet kube-proxy kubeadm

# unpacks TARBALL...: unpack_upstream and kube_versions into a fresh folder; sets code, and err
# (the file).
unpacks() {
  rm -rf "$scratch/out"
  set +e
  (unpack_upstream "$scratch/out" "$@" && kube_versions "$scratch/out") 2>"$scratch/err"
  code=$?
  set -e
}
# refused WHAT WORD... : the last unpacks failed with one line holding each WORD.
refused() {
  local what=$1 w
  shift
  [ "$code" != 0 ] || fail "$what was accepted"
  [ "$(wc -l <"$scratch/err")" = 1 ] || fail "$what: not one line: $(cat "$scratch/err")"
  for w in "$@"; do
    grep -qF -- "$w" "$scratch/err" || fail "$what: the line does not say $w: $(cat "$scratch/err")"
  done
}
five() {
  local b
  for b in "${KUBE_BINARIES[@]}"; do
    [ -x "$scratch/out/$b" ] || fail "$1: no $b unpacked"
    [ "$("$scratch/out/$b" --version)" = "Kubernetes v1.36.2" ] || fail "$1: $b is not the tarball's"
  done
  [ "$(find "$scratch/out" -type f | wc -l)" = 5 ] || fail "$1: more than the five unpacked: $(ls "$scratch/out")"
}

unpacks "$scratch/dl/$server"
[ "$code" = 0 ] || fail "the server tarball alone was refused: $(cat "$scratch/err")"
five "the server tarball"
unpacks "$scratch/dl/$node" "$scratch/dl/$server"
[ "$code" = 0 ] || fail "the node and server tarballs were refused: $(cat "$scratch/err")"
five "the node and server tarballs"

unpacks "$scratch/dl/$node"
refused "the node tarball alone" kube-apiserver kube-controller-manager kube-scheduler "$server"

tarball lacking.tar.gz server v1.36.2 kube-apiserver kube-controller-manager kubelet kube-proxy
unpacks "$scratch/dl/lacking.tar.gz"
refused "a server tarball without kube-scheduler" "lacking.tar.gz has upstream's server layout" kube-scheduler

tarball node-lacking.tar.gz node v1.36.2 kubelet
unpacks "$scratch/dl/node-lacking.tar.gz" "$scratch/dl/$server"
refused "a node tarball without kube-proxy" "node-lacking.tar.gz has upstream's node layout" kube-proxy

mkdir -p "$scratch/flat" && printf '#!/bin/sh\n' >"$scratch/flat/kubelet"
tar -czf "$scratch/dl/flat.tar.gz" -C "$scratch/flat" kubelet
sha256sum "$scratch/dl/flat.tar.gz" | awk '{print $1}' >"$scratch/dl/flat.tar.gz.sha256"
unpacks "$scratch/dl/flat.tar.gz"
refused "a tarball of neither layout" kubernetes/server/bin/ kubernetes/node/bin/

cp "$scratch/dl/$server" "$scratch/dl/changed.tar.gz"
echo 0000000000000000000000000000000000000000000000000000000000000000 >"$scratch/dl/changed.tar.gz.sha256"
unpacks "$scratch/dl/changed.tar.gz"
refused "a tarball its .sha256 does not match" "does not match" changed.tar.gz.sha256
rm "$scratch/dl/changed.tar.gz.sha256"
unpacks "$scratch/dl/changed.tar.gz"
refused "a tarball without its .sha256" "changed.tar.gz.sha256 is missing" https://dl.k8s.io/v1.36.2/changed.tar.gz.sha256

tarball old.tar.gz server v1.35.0 kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy
unpacks "$scratch/dl/old.tar.gz"
refused "binaries of another version" "Kubernetes v1.35.0" "Kubernetes v1.36.2"

# The source, and unpacking once into bin.
shared=$scratch/shared bin=$scratch/target/e2e/bin
mkdir -p "$shared"
set +e
(unset E2E_KUBERNETES_TARBALLS; kube_source) 2>"$scratch/err"
code=$?
set -e
refused "no binaries anywhere" "https://dl.k8s.io/v1.36.2/$server" E2E_KUBERNETES_TARBALLS "$KUBE_REPACKED"
cp "$scratch/dl/$server" "$scratch/dl/$server.sha256" "$shared/"
(unset E2E_KUBERNETES_TARBALLS; kube_source; [ "${kube_tarballs[*]}" = "$shared/$server" ]) \
  || fail "upstream's server tarball in SHARED_BIN is not the source"
E2E_KUBERNETES_TARBALLS="$scratch/dl/$node $scratch/dl/$server" kube_source
[ "${kube_tarballs[*]}" = "$scratch/dl/$node $scratch/dl/$server" ] || fail "E2E_KUBERNETES_TARBALLS is not the source: ${kube_tarballs[*]}"
(cd "$scratch" && E2E_KUBERNETES_TARBALLS=dl kube_source && [ "${kube_tarballs[*]}" = "$scratch/dl/$server $scratch/dl/$node" ]) \
  || fail "E2E_KUBERNETES_TARBALLS naming a folder does not give upstream's tarballs in it"
set +e
(E2E_KUBERNETES_TARBALLS=$scratch/nowhere.tar.gz kube_source) 2>"$scratch/err"
code=$?
set -e
refused "E2E_KUBERNETES_TARBALLS naming no file" "$scratch/nowhere.tar.gz"

E2E_KUBERNETES_TARBALLS=$scratch/dl/$server kube_binaries 2>"$scratch/err" || fail "kube_binaries: $(cat "$scratch/err")"
{ [ -x "$bin/kubelet" ] && [ -s "$bin/.verified" ]; } || fail "kube_binaries left no kubelet or no .verified in bin"
touch "$bin/marker"
E2E_KUBERNETES_TARBALLS=$scratch/dl/$server kube_binaries || fail "kube_binaries a second time"
[ -e "$bin/marker" ] || fail "the same tarball was unpacked again"
set +e
(E2E_KUBERNETES_TARBALLS=$scratch/dl/$node kube_binaries) 2>"$scratch/err"
code=$?
set -e
refused "kube_binaries from the node tarball alone" kube-apiserver
[ -e "$bin/marker" ] || fail "a refused tarball replaced the binaries in bin"
E2E_KUBERNETES_TARBALLS="$scratch/dl/$node $scratch/dl/$server" kube_binaries || fail "kube_binaries from both tarballs"
[ ! -e "$bin/marker" ] || fail "other tarballs were not unpacked again"
echo "binaries: upstream's server and node tarballs by their layout, a lacking, foreign, changed or unsummed tarball and another version refused, the source, unpacked once"
