#!/usr/bin/env bash
# Under pipefail, `producer | grep -q` fails at random: grep -q exits at its first match and the
# producer, still writing, dies of SIGPIPE (CI failed on charts/check.sh's cert-manager check
# that way). The scripts use `has` (grep to /dev/null, which reads everything) instead. Lines
# inside `sh -c "..."` run under dash, without pipefail, and may keep grep -q.
# Usage: lint-shell.sh [FILE...] (default: every pipefail script of the repo).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  # .ci/run too: CI's entry point has no .sh suffix.
  mapfile -t files < <(git ls-files '*.sh' .ci/run | xargs grep -l 'set -[a-z]*o pipefail')
  # e2e/tests/*.sh run inside suite.sh's pipefail shell, e2e/binaries.sh and e2e/cluster/*.sh
  # inside cluster.sh's.
  mapfile -t -O "${#files[@]}" files < <(git ls-files 'e2e/tests/*.sh' e2e/binaries.sh 'e2e/cluster/*.sh')
else
  files=("$@")
fi
bad=$(grep -nE '\|[[:space:]]*grep[[:space:]]+-[a-zA-Z]*q' "${files[@]}" /dev/null | grep -vE 'sh -c "|^[^:]*:[0-9]+:[[:space:]]*#' || true)
if [ -n "$bad" ]; then
  echo "FAIL: grep -q at the end of a pipeline under pipefail (use has, or grep -q <<<\"\$x\"):"
  echo "$bad"
  exit 1
fi
# The e2e tests source e2e/lib.sh from `sh -c ". lib.sh; ..."` (dash) too: a bash-only construct
# there (an array, [[ ]]) stops that shell at parse time, and the check it runs never passes.
if [ $# -eq 0 ] && ! sh -n e2e/lib.sh; then
  echo "FAIL: e2e/lib.sh does not parse under sh (dash), which the tests source it from"
  exit 1
fi
echo "lint-shell: ${#files[@]} scripts, no grep -q behind a pipe; e2e/lib.sh parses under sh"
