# shellcheck shell=bash
# What the control plane's and each node's PID 1 share: a daemon started in a memory cgroup of
# its own, a bounded wait for it, and the watch that says when one dies. Sourced by e2e/cluster.sh.

wait_for() { # what seconds cmd...
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "$what did not come up within $secs s (see $D/logs/)"
}
tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
apiserver_ready() { "$S/bin/kubectl" --kubeconfig "$S/admin.kubeconfig" get --raw /readyz; }

# Each daemon runs in a memory cgroup of its own, CGROUP_ROOT/daemons/NAME (beside the kubelet's
# kubepods), as a container would: its working set is read the way kubelet reads a container's
# (e2e/memory.py). Only the memory hierarchy: a CPU cgroup of its own would change how the
# daemons share the cores with each other and with the machine.
daemon() { # name cmd...
  local name=$1
  shift
  (
    daemon_cgroup "$CGROUP_ROOT/daemons/$name" || log "$name: no memory cgroup of its own; it runs in its parent's"
    exec "$@"
  ) >> "$D/logs/$name.log" 2>&1 &
  echo $! > "$D/pids/$name"
}
# Moves the calling (sub)shell into the cgroup v1 memory cgroup PATH, made first.
daemon_cgroup() { # path
  local dir=/sys/fs/cgroup/memory$1
  [ -e /sys/fs/cgroup/memory/memory.usage_in_bytes ] && mkdir -p "$dir" && echo "$BASHPID" > "$dir/cgroup.procs"
}

# PID 1 stays; when any daemon dies the cluster is broken, and saying so beats a hung test.
watch_daemons() {
  touch "$D/started"
  while sleep 2; do
    for f in "$D"/pids/*; do
      kill -0 "$(cat "$f")" 2>/dev/null || { log "$(basename "$f") exited (see $D/logs/$(basename "$f").log)"; touch "$D/broken"; }
    done
  done
}
