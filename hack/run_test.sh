#!/usr/bin/env bash
# Checks `make run` (hack/run.sh) the way a newcomer meets it, with the debug binaries built:
# 1. no kube context and no kube-apiserver anywhere: one line saying what to install, exit 2,
#    and no build first;
# 2. the binaries' status is make's: both refusing a flag value makes `make run-binaries` fail;
# 3. no kube context but a kube-apiserver (KUBE_APISERVER or ../shared/bin): both binaries come
#    up against a throwaway control plane by themselves, and Ctrl-C ends it all with status 0;
# 4. Ctrl-C (SIGINT to the process group) while both binaries run: status 0 and nothing on
#    stderr when both stop cleanly, the binary's status when one does not;
# 5. the route (`hack/run.sh route`, no build, no cluster): KUBE_APISERVER set wins over a kube
#    context that answers; a context that answers is announced (context, server, node, dry-run)
#    when KUBE_APISERVER is not set; a context that does not answer (a KUBECONFIG naming a
#    closed port) is passed over for KUBE_APISERVER, and with no kube-apiserver at all gives one
#    line naming that context.
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
  { [ ! -s "$scratch/out" ] && [ "$(wc -l <"$scratch/err")" = 1 ]; } || fail "not one line: $(cat "$scratch/out" "$scratch/err")"
  grep -q "kube-apiserver" "$scratch/err" || fail "the line does not say to install kube-apiserver: $(cat "$scratch/err")"
fi

# 5. Stand-ins: a kubectl whose context answers (it logs what it is asked), openssl, a
#    kube-apiserver and an etcd; nothing is started, so they need do nothing.
stand=$scratch/stand
mkdir -p "$stand/bin"
cat >"$stand/bin/kubectl" <<EOS
#!/usr/bin/env bash
echo "\$*" >>"$stand/kubectl.log"
case "\$*" in
  "config current-context") echo prod ;;
  "config view "*) echo https://prod.example:6443 ;;
  "get nodes "*) echo node-a ;;
  *) exit 1 ;;
esac
EOS
printf '#!/bin/sh\nexit 0\n' >"$stand/bin/openssl"
printf '#!/bin/sh\nexit 0\n' >"$stand/kube-apiserver"
chmod +x "$stand/bin/kubectl" "$stand/bin/openssl" "$stand/kube-apiserver"
# route [VAR=VALUE...]: hack/run.sh route from the copy with no ../shared, with the stand-ins;
# sets code, and out and err (the files).
route() {
  set +e
  env -u KUBE_APISERVER -u NODE_NAME -u DRY_RUN PATH="$stand/bin:/usr/bin:/bin" KUBECTL="$stand/bin/kubectl" \
    KUBE_ETCD="$stand/kube-apiserver" CARGO=/bin/false "$@" bash "$scratch/root/hack/run.sh" route >"$scratch/out" 2>"$scratch/err"
  code=$?
  set -e
}
said() { cat "$scratch/out" "$scratch/err"; }
route KUBE_APISERVER="$stand/kube-apiserver"
{ [ "$code" = 0 ] && [ "$(head -n 1 "$scratch/out")" = control-plane ]; } \
  || fail "KUBE_APISERVER set, a context that answers: not the throwaway control plane ($code): $(said)"
grep -q "not the current kube context" "$scratch/out" || fail "the throwaway control plane is not announced as such: $(said)"
[ ! -e "$stand/kubectl.log" ] || fail "KUBE_APISERVER set, yet the kube context was asked: $(cat "$stand/kubectl.log")"
route
{ [ "$code" = 0 ] && [ "$(head -n 1 "$scratch/out")" = cluster ]; } || fail "a context that answers: not the cluster route ($code): $(said)"
[ "$(wc -l <"$scratch/out")" -le 3 ] || fail "the announcement is over two lines: $(said)"
for w in '"prod"' https://prod.example:6443 node-a 'dry-run: every deletion' DRY_RUN=false; do
  grep -qF -- "$w" "$scratch/out" || fail "the cluster route's announcement does not say $w: $(said)"
done
route DRY_RUN=false
grep -qF "DRY_RUN=false: deletions" "$scratch/out" || fail "DRY_RUN=false is not announced: $(said)"
route DRY_RUN=maybe
{ [ "$code" = 2 ] && [ "$(wc -l <"$scratch/err")" = 1 ]; } || fail "DRY_RUN=maybe was not refused in one line ($code): $(said)"
route KUBE_APISERVER="$scratch/none/kube-apiserver"
{ [ "$code" = 2 ] && [ ! -s "$scratch/out" ] && [ "$(wc -l <"$scratch/err")" = 1 ]; } \
  || fail "KUBE_APISERVER naming no file: not one line and exit 2 ($code): $(said)"
grep -qF "KUBE_APISERVER=$scratch/none/kube-apiserver" "$scratch/err" || fail "the line does not name KUBE_APISERVER: $(said)"
# A real kubectl and a kube context whose server is a closed port.
kubectl=${KUBECTL:-$(command -v kubectl || echo "$root/.tools/bin/kubectl")}
if [ ! -x "$kubectl" ]; then
  skip "run check 5, a context that does not answer: no kubectl (bash .ci/tools.sh)"
else
  cat >"$scratch/kubeconfig" <<'EOK'
apiVersion: v1
kind: Config
clusters: [{name: closed, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: nobody, user: {token: none}}]
contexts: [{name: closed-port, context: {cluster: closed, user: nobody}}]
current-context: closed-port
EOK
  route KUBECTL="$kubectl" KUBECONFIG="$scratch/kubeconfig" KUBE_APISERVER="$stand/kube-apiserver"
  { [ "$code" = 0 ] && [ "$(head -n 1 "$scratch/out")" = control-plane ]; } \
    || fail "KUBE_APISERVER set, a context that does not answer: not the throwaway control plane ($code): $(said)"
  if PATH=/usr/bin:/bin command -v kube-apiserver >/dev/null; then
    skip "run check 5, nothing to run against: kube-apiserver is on the PATH"
  else
    route KUBECTL="$kubectl" KUBECONFIG="$scratch/kubeconfig"
    { [ "$code" = 2 ] && [ ! -s "$scratch/out" ] && [ "$(wc -l <"$scratch/err")" = 1 ]; } \
      || fail "a context that does not answer and no kube-apiserver: not one line and exit 2 ($code): $(said)"
    for w in '"closed-port"' https://127.0.0.1:1 KUBECONFIG KUBE_APISERVER=; do
      grep -qF -- "$w" "$scratch/err" || fail "the line does not say $w: $(said)"
    done
  fi
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
  { [ -e "$scratch/started-controller-manager" ] && [ -e "$scratch/started-node-agent" ]; } \
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
echo "run: one line when nothing to run against, KUBE_APISERVER over a kube context, a real cluster announced, the binaries' status, Ctrl-C, a throwaway control plane by itself"
