#!/usr/bin/env bash
# Checks `make run` (hack/run.sh) the way a newcomer meets it, with the debug binaries built:
# 1. no kube context and no kube-apiserver anywhere: one line saying what to install, exit 2,
#    and no build first;
# 2. the binaries' status is make's: both refusing a flag value makes `make run-binaries` fail;
# 3. no kube context but a kube-apiserver (KUBE_APISERVER or ../shared/bin): both binaries come
#    up against a throwaway control plane by themselves, and Ctrl-C ends it all with status 0;
# 4. Ctrl-C (SIGINT to the process group) while both binaries run: status 0 and nothing on
#    stderr when both stop cleanly, the binary's status when one does not.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${TARGET_DIR:-${CARGO_TARGET_DIR:-$root/target}}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# A skip says so; under CI=true it fails, so a CI that lost what a check needs cannot pass by
# skipping it.
skip() { if [ "${CI:-}" = true ]; then echo "FAIL (CI=true, no skips): $*"; exit 1; fi; echo "SKIPPED $*"; }

# 1. A copy of the script in a root with no ../shared; a PATH without kube-apiserver.
mkdir -p "$scratch/root/hack"
cp "$root/hack/run.sh" "$scratch/root/hack/"
if PATH=/usr/bin:/bin command -v kube-apiserver >/dev/null; then
  skip "run check 1: kube-apiserver is on the PATH"
else
  set +e
  env -u KUBE_APISERVER -u NODE_NAME PATH=/usr/bin:/bin KUBECTL=/nonexistent CARGO=/bin/false \
    bash "$scratch/root/hack/run.sh" >"$scratch/out" 2>"$scratch/err"
  code=$?
  set -e
  [ "$code" = 2 ] || fail "with nothing to run against, make run exited $code, not 2: $(cat "$scratch/out" "$scratch/err")"
  [ ! -s "$scratch/out" ] && [ "$(wc -l <"$scratch/err")" = 1 ] || fail "not one line: $(cat "$scratch/out" "$scratch/err")"
  grep -q "kube-apiserver" "$scratch/err" || fail "the line does not say to install kube-apiserver: $(cat "$scratch/err")"
fi

# 2. Both binaries refuse --watch-silent-after=2s (env GROUNDSKEEPER_WATCH_SILENT_AFTER) at start.
set +e
GROUNDSKEEPER_WATCH_SILENT_AFTER=2s KUBECONFIG=/dev/null make -s -C "$root" run-binaries NODE_NAME=nowhere \
  TARGET_DIR="$target" >"$scratch/out" 2>&1
code=$?
set -e
[ "$code" != 0 ] || fail "make run-binaries exited 0 while both binaries failed: $(cat "$scratch/out")"

# 4. Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group, while both
#    binaries run. Stand-ins take the binaries' place (they stop cleanly on SIGINT or SIGTERM,
#    as the real ones do, or with the status a test gives them), so this needs no cluster.
fake=$scratch/fake
mkdir -p "$fake/debug"
for b in controller-manager node-agent; do
  cat >"$fake/debug/$b" <<EOS
#!/usr/bin/env bash
trap 'exit \${STOP_STATUS_$(tr - _ <<<"$b"):-0}' INT TERM
touch "$scratch/started-$b"
while :; do sleep 0.1; done
EOS
  chmod +x "$fake/debug/$b"
done
ctrl_c() {
  rm -f "$scratch"/started-*
  # setsid: a process group of its own, as a terminal's foreground job; python3 undoes the
  # SIGINT-ignored this script's background jobs start with, so run.sh meets SIGINT as under
  # a terminal.
  setsid python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
    env "$@" TARGET_DIR="$fake" bash "$root/hack/run.sh" binaries >"$scratch/out" 2>"$scratch/err" &
  local run=$!
  for _ in $(seq 1 100); do
    [ -e "$scratch/started-controller-manager" ] && [ -e "$scratch/started-node-agent" ] && break
    sleep 0.1
  done
  [ -e "$scratch/started-controller-manager" ] && [ -e "$scratch/started-node-agent" ] \
    || { kill -KILL -- "-$run" 2>/dev/null; fail "the stand-in binaries did not start: $(cat "$scratch/err")"; }
  kill -INT -- "-$run"
  set +e
  wait "$run"
  code=$?
  set -e
}
ctrl_c
[ "$code" = 0 ] || fail "Ctrl-C with both binaries stopping cleanly: make run exited $code, not 0: $(cat "$scratch/out" "$scratch/err")"
[ ! -s "$scratch/err" ] || fail "Ctrl-C printed errors: $(cat "$scratch/err")"
ctrl_c STOP_STATUS_node_agent=3
[ "$code" = 3 ] || fail "Ctrl-C with the node-agent stopping with status 3: make run exited $code, not 3: $(cat "$scratch/out" "$scratch/err")"

# 3. Against a throwaway control plane, started by make run itself.
apiserver=${KUBE_APISERVER:-}
[ -n "$apiserver" ] || { [ -x "$root/../shared/bin/kube-apiserver" ] && apiserver=$root/../shared/bin/kube-apiserver; } || true
if [ -z "$apiserver" ] || [ ! -x /usr/bin/etcd ] || ! command -v openssl >/dev/null; then
  skip "run check 3: no kube-apiserver, etcd or openssl here"
elif (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null || (exec 3<>/dev/tcp/127.0.0.1/8081) 2>/dev/null; then
  skip "run check 3: 127.0.0.1:8080 or :8081 is taken"
else
  # Its own process group, as a terminal's foreground job is, so Ctrl-C is a kill -INT -PGID.
  setsid env -u NODE_NAME KUBECONFIG=/dev/null KUBECTL=/nonexistent KUBE_APISERVER="$apiserver" \
    TARGET_DIR="$target" CARGO=true bash "$root/hack/run.sh" >"$scratch/log" 2>&1 &
  run=$!
  ready() {
    python3 - "$@" <<'PY'
import sys, urllib.request
for port in sys.argv[1:]:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2)
    except Exception:
        sys.exit(1)
PY
  }
  for _ in $(seq 1 240); do
    ready 8080 8081 && break
    kill -0 "$run" 2>/dev/null || break
    sleep 0.5
  done
  ready 8080 8081 || { kill -TERM -- "-$run" 2>/dev/null; wait "$run" || true; fail "both binaries not ready within 120 s: $(tail -n 30 "$scratch/log")"; }
  kill -INT -- "-$run"
  set +e
  wait "$run"
  code=$?
  set -e
  [ "$code" = 0 ] || fail "make run after Ctrl-C exited $code, not 0: $(tail -n 30 "$scratch/log")"
  grep -q "throwaway control plane" "$scratch/log" || fail "no control plane was started: $(tail -n 30 "$scratch/log")"
fi
echo "run: one line when nothing to run against, the binaries' status, Ctrl-C, a throwaway control plane by itself"
