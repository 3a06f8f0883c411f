#!/usr/bin/env bash
# make metrics-check: what both binaries serve on /metrics passes `promtool check metrics`: the
# text format as Prometheus parses it, and its lints (a counter ends in _total, units are base
# units, every family has HELP). With the debug binaries built:
# 1. promtool must refuse a bad exposition (a counter not named _total, then a line that does not
#    parse), so a check that checks nothing does not pass;
# 2. both binaries, every controller and task on, against KUBECONFIG's cluster or else a
#    throwaway control plane (KUBE_APISERVER): their /metrics once both are ready, when every
#    component has registered its metrics and the clients have made requests; the node-agent
#    serves no family under a name of kube-proxy's (`kubeproxy_*`): kube-proxy runs on the same
#    node, and a query summing its series by node would add ours.
# Usage: metrics_check.sh [scrape] (scrape: step 2 alone, inside the control plane).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${TARGET_DIR:-${CARGO_TARGET_DIR:-$root/target}}
fail() { echo "FAIL: $*"; exit 1; }
# A skip says so; under CI=true it fails, so a CI that lost promtool or the apiserver cannot pass
# by skipping the check.
skip() { if [ "${CI:-}" = true ]; then echo "FAIL (CI=true, no skips): $*"; exit 1; fi; echo "SKIPPED $*"; }
promtool=${PROMTOOL:-$(command -v promtool || true)}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# GET http://127.0.0.1:PORT/PATH into FILE; fails unless 200.
get() {
  python3 - "$1" "$2" "$3" <<'PY'
import sys, urllib.request
port, path, out = sys.argv[1:]
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        body = r.read()
except Exception:
    sys.exit(1)
open(out, "wb").write(body)
PY
}

scrape() {
  local cm_port na_port
  scratch=$(mktemp -d)
  cm_port=$(free_port)
  na_port=$(free_port)
  # The sysctl webhook too, in a throwaway control plane only: it writes its certificate's
  # Secret even under dry-run.
  local webhook=()
  if [ -n "${METRICS_CHECK_WEBHOOK:-}" ]; then
    webhook=(--sysctl-webhook --webhook-addr "127.0.0.1:$(free_port)" --webhook-certificates=self-signed
      --webhook-tls-secret=groundskeeper-metrics-check --webhook-cert-hosts=localhost)
  fi
  # Dry-run: the node-agent judges this machine's conntrack table and writes nothing.
  GROUNDSKEEPER_DRY_RUN=true "$target/debug/controller-manager" --admin-addr "127.0.0.1:$cm_port" \
    --leader-elect=false --controllers='*' "${webhook[@]}" >"$scratch/cm.log" 2>&1 &
  cm=$!
  GROUNDSKEEPER_DRY_RUN=true NODE_NAME=${NODE_NAME:-groundskeeper-metrics} "$target/debug/node-agent" \
    --admin-addr "127.0.0.1:$na_port" --tasks='*' >"$scratch/na.log" 2>&1 &
  na=$!
  trap 'kill -TERM $cm $na 2>/dev/null || true; wait $cm $na 2>/dev/null || true; rm -rf "$scratch"' EXIT
  local ready=
  for _ in $(seq 1 120); do
    if get "$cm_port" /readyz /dev/null && get "$na_port" /readyz /dev/null; then ready=1; break; fi
    kill -0 "$cm" 2>/dev/null || fail "controller-manager exited: $(tail -n 20 "$scratch/cm.log")"
    kill -0 "$na" 2>/dev/null || fail "node-agent exited: $(tail -n 20 "$scratch/na.log")"
    sleep 0.5
  done
  [ -n "$ready" ] || fail "both binaries not ready within 60 s: $(tail -n 10 "$scratch/cm.log" "$scratch/na.log")"
  local bin port out
  for bin in controller-manager node-agent; do
    port=$cm_port
    [ "$bin" = node-agent ] && port=$na_port
    get "$port" /metrics "$scratch/$bin.prom" || fail "$bin: GET /metrics did not answer 200"
    grep -q '^rest_client_requests_total{' "$scratch/$bin.prom" \
      || fail "$bin: no rest_client_requests_total series after its first lists"
    grep -q '^rest_client_rate_limiter_duration_seconds_count{' "$scratch/$bin.prom" \
      || fail "$bin: no rest_client_rate_limiter_duration_seconds series: its requests did not pass the QPS budget"
    if ! out=$("$promtool" check metrics <"$scratch/$bin.prom" 2>&1); then
      fail "$bin: promtool check metrics: $out"
    fi
    if [ "$bin" = node-agent ] && grep -q '^# TYPE kubeproxy_' "$scratch/$bin.prom"; then
      fail "node-agent serves kube-proxy's names: $(grep '^# TYPE kubeproxy_' "$scratch/$bin.prom" | tr '\n' ' ')"
    fi
    echo "metrics-check: $bin: $(grep -c '^# TYPE ' "$scratch/$bin.prom") metric families pass promtool check metrics"
    [ -z "${METRICS_CHECK_KEEP:-}" ] || cp "$scratch/$bin.prom" "$METRICS_CHECK_KEEP/$bin.prom"
  done
}

if [ "${1:-}" = scrape ]; then
  scrape
  exit
fi

if [ -z "$promtool" ]; then
  skip "metrics check: no promtool on the PATH (Debian: apt-get install prometheus)"
  exit 0
fi
# 1. promtool refuses what it must.
bad_name=$(printf '# HELP groundskeeper_bad A counter.\n# TYPE groundskeeper_bad counter\ngroundskeeper_bad 1\n')
if "$promtool" check metrics <<<"$bad_name" >/dev/null 2>&1; then
  fail "promtool passed a counter whose name does not end in _total"
fi
if "$promtool" check metrics <<<'groundskeeper_bad{ 1' >/dev/null 2>&1; then
  fail "promtool passed an exposition that does not parse"
fi

# 2. Both binaries' own.
if [ -n "${KUBECONFIG:-}" ]; then
  scrape
elif [ -n "${KUBE_APISERVER:-}" ]; then
  node=groundskeeper-metrics
  METRICS_CHECK_WEBHOOK=1 NODE_NAME=$node "$target/debug/control-plane" --node "$node" \
    --crd "$root/crds/sysctlpolicies.groundskeeper.dev.yaml" -- bash "$0" scrape
else
  skip "metrics check of the binaries: no KUBECONFIG and no KUBE_APISERVER to start a control plane"
fi
